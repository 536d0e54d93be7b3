"""Counting the targets at pretraining scale (natbias.counts), against numpy
reading the same data in the same process, side by side, alternating rounds:

- token files (uint32, OLMo-core's rule: instances of 2,048, each one's
  first token no target) against a chunked ``np.bincount`` over the memmap;
- a 🤗 Arrow dataset saved to disk (``natbias.hf.count_targets``, causal)
  against ``np.bincount`` over the Arrow column's values (no Python lists);
- 1 against 2 gloo ranks (the wall time of the count on every rank);
- the first call against a cached one;
- peak RSS growth of a count of 0.5 and of 2 GiB of tokens (a process each).

    OMP_NUM_THREADS=1 python research/bench_counting.py --out research/results/counting_speed.md

Every figure is from the machine it ran on; the table's head says which.
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

VOCAB = 100_278  # a pretraining tokenizer's (OLMo 2's dolma2): uint32 ids
INSTANCE = 2048
CHUNK = 1 << 22
PARTS = ("rates", "ranks", "cache", "rss")


def zipf_file(path, tokens, dtype=np.uint32, seed=0):
    """A Zipfian token file, written a piece at a time."""
    rng = np.random.default_rng(seed)
    with open(path, "wb") as out:
        for start in range(0, tokens, 1 << 24):
            n = min(1 << 24, tokens - start)
            out.write(rng.zipf(1.1, n).clip(max=VOCAB - 1).astype(dtype).tobytes())


def numpy_files(path):
    tokens = np.memmap(path, dtype=np.uint32, mode="r")
    counts = np.zeros(VOCAB, dtype=np.int64)
    for start in range(0, tokens.size, CHUNK):
        counts += np.bincount(tokens[start : start + CHUNK], minlength=VOCAB)
    return counts


def natbias_files(path):
    from natbias.counts import count_token_files

    return count_token_files([path], "uint32", VOCAB, instance_length=INSTANCE, cache=False)


def numpy_arrow(dataset):
    counts = np.zeros(VOCAB, dtype=np.int64)
    for chunk in dataset.data.table.column("input_ids").chunks:
        counts += np.bincount(chunk.values.to_numpy(), minlength=VOCAB)
    return counts


def natbias_arrow(dataset):
    from natbias.hf import count_targets

    return count_targets(dataset, VOCAB, causal=True, cache=False)


def side_by_side(ours, baseline, argument, tokens, rounds):
    base_times, our_times = [], []
    for _ in range(rounds):
        for call, times in ((baseline, base_times), (ours, our_times)):
            start = time.perf_counter()
            call(argument)
            times.append(time.perf_counter() - start)
    ours_rate = tokens / statistics.median(our_times) / 1e6
    base_rate = tokens / statistics.median(base_times) / 1e6
    return ours_rate, base_rate


def ranks_worker(rank, world, folder, path, rounds, times):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{folder}/store{world}", rank=rank,
                            world_size=world)  # fmt: skip
    natbias_files(path)  # warm: the same pages, the same imports
    elapsed = []
    for _ in range(rounds):
        dist.barrier()
        start = time.perf_counter()
        counts = natbias_files(path)
        elapsed.append(time.perf_counter() - start)
    np.save(f"{folder}/w{world}r{rank}.npy", counts)
    times[rank] = elapsed
    dist.destroy_process_group()


def ranks(folder, path, world, rounds):
    """The median over rounds of the slowest rank's wall time of one count,
    and whether all ranks got the same counts."""
    import torch.multiprocessing as mp

    for stale in os.listdir(folder):
        os.remove(os.path.join(folder, stale))
    manager = mp.Manager()
    times = manager.dict()
    mp.spawn(ranks_worker, args=(world, folder, path, rounds, times), nprocs=world)
    counts = [np.load(f"{folder}/w{world}r{r}.npy") for r in range(world)]
    slowest = [max(times[r][k] for r in range(world)) for k in range(rounds)]
    return statistics.median(slowest), all((c == counts[0]).all() for c in counts)


def resident_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def rss_child(path, numpy_baseline=False):
    """Run in its own process: the peak resident memory (MiB) during one count
    of ``path`` above what the process held before it, sampled every 2 ms
    (the process's lifetime peak, ru_maxrss, is set by torch's import)."""
    import threading

    import torch  # noqa: F401  (imported before the baseline, as a user has it)

    from natbias.counts import count_token_files

    warm = path + ".warm"  # imports and first calls, on a file of its own
    np.arange(1 << 16, dtype=np.uint32).tofile(warm)
    count_token_files([warm], "uint32", VOCAB, cache=False, instance_length=16)
    before, peak, done = resident_mib(), [0.0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], resident_mib())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    if numpy_baseline:
        numpy_files(path)
    else:
        count_token_files([path], "uint32", VOCAB, cache=False, instance_length=INSTANCE)
    done.set()
    sampler.join()
    print(max(peak[0] - before, 0.0))


def cpu_model() -> str:
    with open("/proc/cpuinfo") as info:
        names = [line.split(":", 1)[1].strip() for line in info if line.startswith("model name")]
    return names[0] if names else platform.machine()


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=128 << 20, help="token-file tokens (uint32)")
    parser.add_argument("--arrow-tokens", type=int, default=20_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rss-gib", type=float, nargs=2, default=(0.5, 2.0))
    parser.add_argument(
        "--work", default=None, help="folder for the data (default: a temporary one)"
    )
    parser.add_argument("--out", help="write the Markdown table here too")
    parser.add_argument("--parts", nargs="+", default=PARTS, choices=PARTS, help="what to measure")
    parser.add_argument("--rss-child", help=argparse.SUPPRESS)
    parser.add_argument("--rss-numpy", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        return rss_child(args.rss_child, args.rss_numpy)
    import datasets
    import torch

    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    work = args.work or tempfile.mkdtemp(prefix="bench_counting_")
    os.makedirs(work, exist_ok=True)
    lines = [
        f"Machine: {cpu_model()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}, "
        f"datasets {datasets.__version__}; {args.rounds} rounds, medians.",
        "",
        "| source | natbias M tok/s | numpy M tok/s | ratio |",
        "|---|---|---|---|",
    ]
    path = os.path.join(work, "tokens.u32")
    if not os.path.exists(path) or os.path.getsize(path) != 4 * args.tokens:
        zipf_file(path, args.tokens)
    if "rates" in args.parts:
        rates(args, work, path, lines)
    if "ranks" in args.parts or "cache" in args.parts:
        lines += [
            "",
            "| count | wall s | against one process | all ranks equal |",
            "|---|---|---|---|",
        ]
    if "ranks" in args.parts:
        gloo = os.path.join(work, "gloo")
        os.makedirs(gloo, exist_ok=True)
        one, _ = ranks(gloo, path, 1, args.rounds)
        two, equal = ranks(gloo, path, 2, args.rounds)
        lines.append(f"| 1 gloo rank | {one:.2f} | 1.00 | yes |")
        lines.append(f"| 2 gloo ranks | {two:.2f} | {two / one:.2f} | {'yes' if equal else 'NO'} |")
        print(*lines[-2:], sep="\n", flush=True)
    if "cache" in args.parts:
        cache_rows(path, work, lines)
    if "rss" in args.parts:
        rss_rows(args, work, lines)
    if args.out:
        with open(args.out, "w") as report:
            report.write("# Counting the targets at scale\n\n`OMP_NUM_THREADS=1 python "
                         "research/bench_counting.py` (research/bench_counting.py).\n\n")  # fmt: skip
            report.write("\n".join(lines) + "\n")


def rates(args, work, path, lines):
    import datasets

    ours, base = side_by_side(natbias_files, numpy_files, path, args.tokens, args.rounds)
    lines.append(f"| token files, {args.tokens / 2**20:.0f} Mi uint32 | {ours:.0f} | {base:.0f} | "
                 f"{ours / base:.2f} |")  # fmt: skip
    print(lines[-1], flush=True)

    folder = os.path.join(work, "arrow")
    if not os.path.isdir(folder):
        rows = args.arrow_tokens // 512
        ids = np.random.default_rng(1).zipf(1.1, rows * 512).clip(max=VOCAB - 1).astype(np.int32)
        table = {"input_ids": list(ids.reshape(rows, 512))}
        features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
        datasets.Dataset.from_dict(table, features=features).save_to_disk(folder)
    dataset = datasets.load_from_disk(folder)
    tokens = sum(len(c.values) for c in dataset.data.table.column("input_ids").chunks)
    ours, base = side_by_side(natbias_arrow, numpy_arrow, dataset, tokens, args.rounds)
    lines.append(f"| 🤗 Arrow dataset, {tokens / 1e6:.0f} M int32 | {ours:.0f} | {base:.0f} | "
                 f"{ours / base:.2f} |")  # fmt: skip
    print(lines[-1], flush=True)


def cache_rows(path, work, lines):
    from natbias.counts import count_token_files

    cache = tempfile.mkdtemp(prefix="cache_", dir=work)
    start = time.perf_counter()
    count_token_files([path], "uint32", VOCAB, instance_length=INSTANCE, cache_dir=cache)
    first = time.perf_counter() - start
    start = time.perf_counter()
    count_token_files([path], "uint32", VOCAB, instance_length=INSTANCE, cache_dir=cache)
    cached = time.perf_counter() - start
    lines.append(f"| first call, cache on | {first:.2f} | | |")
    lines.append(f"| cached call | {cached:.4f} | {cached / first:.4f} of the first | |")
    print(*lines[-2:], sep="\n", flush=True)


def rss_rows(args, work, lines):
    lines += ["", "| tokens counted | peak RSS growth, natbias MiB | numpy on one memmap of the file MiB |",
              "|---|---|---|"]  # fmt: skip
    for gib in args.rss_gib:
        n = int(gib * 2**30) // 4
        sized = os.path.join(work, f"rss_{gib:g}.u32")
        if not os.path.exists(sized) or os.path.getsize(sized) != 4 * n:
            zipf_file(sized, n, seed=2)
        grown = []
        for extra in ([], ["--rss-numpy"]):
            command = [sys.executable, __file__, "--rss-child", sized, *extra]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            grown.append(float(out.split()[-1]))
        lines.append(
            f"| {gib:g} GiB ({n / 2**20:.0f} Mi uint32) | {grown[0]:.1f} | {grown[1]:.1f} |"
        )
        print(lines[-1], flush=True)


if __name__ == "__main__":
    main()
