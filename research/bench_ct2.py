"""Translation speed side by side: CTranslate2 (natbias-ct2-converter, float32
and int8) against fairseq-generate, the same natural-bias model, test set,
beam and batch size, on the same CPU threads.

The model has the shape of ``transformer_natbias_iwslt_de_en`` (6+6 layers,
d 256, FFN 256, 4 heads, all embeddings tied), briefly trained on Multi30k
De->En (joint SentencePiece, 8,000 pieces) so that its translations end
where sentences do; it is trained once into ``--work`` and reused. Each
round times fairseq-generate (a process of its own; its own figure, which
counts generation and not start-up or loading) and CTranslate2's
``translate_batch`` (the model loaded beforehand) on all of test_2016_flickr,
the engines alternating so that a change in the machine's load meets each
alike; with 2 threads each (the machine's cores), then 1. With 2, CTranslate2
runs both ways it can: each batch's operations on 2 threads (intra_threads,
as fairseq does), and 2 batches at a time on a thread each (inter_threads,
its way to throughput for a small model). Printed, and
written to ``--out``: sentences per second, median and range over the
rounds, the ratio to fairseq per round, and whether the engines translate
alike (same hypothesis, BLEU).

    .venv/bin/python research/bench_ct2.py --rounds 3 --out research/results/ct2_speed.md
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples" / "paper"))  # make demo's data preparation

import pipeline  # noqa: E402
from quality import quality  # noqa: E402

from natbias.ct2_converter import convert  # noqa: E402
from natbias.tools.generate_output import parse_generate_output  # noqa: E402

BIN = Path(sys.executable).parent
MAX_LENGTH = 200  # fairseq-generate's default --max-len-b, given to both
TRAINING = [
    "--arch", "transformer_natbias_iwslt_de_en", "--share-all-embeddings",
    "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "1.5e-3",
    "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100", "--dropout", "0.1",
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
    "--max-tokens", "2048", "--disable-validation", "--save-interval", "1000",
    "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "50",
    "--seed", "1", "--cpu", "--num-workers", "0",
]  # fmt: skip


def run(command, threads, **kwargs):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return subprocess.run(
        [str(c) for c in command], env=env, capture_output=True, text=True, check=True, **kwargs
    )


def train(data: Path, work: Path, updates: int, threads: int) -> Path:
    """Trained to ``updates``, resuming a checkpoint with fewer (fairseq-train
    on one with as many would still make one more update)."""
    checkpoint = work / "model" / "checkpoint_last.pt"
    if checkpoint.exists() and trained_updates(checkpoint) >= updates:
        return checkpoint
    started = time.perf_counter()
    run(
        [BIN / "fairseq-train", data, "--user-dir", "fairseq_natbias", *TRAINING,
         "--max-update", updates, "--save-dir", checkpoint.parent],
        threads,
        cwd=REPO,
    )  # fmt: skip
    print(f"trained to update {updates} ({time.perf_counter() - started:.0f} s)")
    return checkpoint


def trained_updates(checkpoint: Path) -> int:
    import torch

    state = torch.load(checkpoint, map_location="cpu", weights_only=False, mmap=True)
    return state["optimizer_history"][-1]["num_updates"]


def fairseq_generate(data, checkpoint, args, threads):
    """(sentences/s by fairseq-generate's own clock, hypotheses by id)."""
    out = run(
        [BIN / "fairseq-generate", data, "--user-dir", "fairseq_natbias", "--path", checkpoint,
         "--beam", args.beam, "--batch-size", args.batch_size, "--max-len-b", MAX_LENGTH,
         "--required-batch-size-multiple", "1", "--cpu", "--num-workers", "0"],
        threads,
        cwd=REPO,
    )  # fmt: skip
    rate = re.search(
        r"Translated [\d,]+ sentences .*?\(([\d.]+) sentences/s", out.stdout + out.stderr
    )
    sentences = parse_generate_output(out.stdout.splitlines())
    return float(rate[1]), [sentences[i].hypothesis.split() for i in sorted(sentences)]


def ctranslate2_translate(translator, sources, args):
    started = time.perf_counter()
    results = translator.translate_batch(
        sources, beam_size=args.beam, max_batch_size=args.batch_size, max_decoding_length=MAX_LENGTH
    )
    elapsed = time.perf_counter() - started
    return len(sources) / elapsed, [r.hypotheses[0] for r in results]


def bleu(hypotheses, references):
    text = ["".join(h).replace("\u2581", " ").strip() for h in hypotheses]
    return quality(text, references)["BLEU"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--multi30k", type=Path, default=REPO.parent / "shared/data/multi30k")
    parser.add_argument("--work", type=Path, default=REPO / "work/bench_ct2")
    parser.add_argument("--updates", type=int, default=1500, help="training updates")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[2, 1], help="each engine's threads, in turn"
    )
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", type=Path, help="write the results here (Markdown)")
    args = parser.parse_args()
    import ctranslate2

    most = max(args.threads)
    # Multi30k De-En, joint SentencePiece (8,000 pieces), binarised: make demo's
    data = pipeline.prepare(args.multi30k, args.work, vocab_size=8000, langs=("de", "en"))
    checkpoint = train(data, args.work, args.updates, most)
    directories = {}
    for quantization in ("float32", "int8"):
        directories[quantization] = args.work / f"ct2-{quantization}"
        convert(checkpoint, directories[quantization], data, quantization=quantization, force=True)
    sources = [line.split() for line in (args.work / "text/test.de").read_text().splitlines()]
    references = (args.work / "text/test.raw.en").read_text(encoding="utf-8").splitlines()
    rates, outputs, load = {}, {}, [os.getloadavg()[0]]
    for threads in args.threads:
        # Each batch's operations on the threads (as fairseq's), and, with more than
        # one, as many batches at a time on one thread each (CTranslate2's inter_threads).
        layouts = {"": (1, threads)} | (
            {", batches in parallel": (threads, 1)} if threads > 1 else {}
        )
        translators = {
            q + name: ctranslate2.Translator(
                str(d), device="cpu", inter_threads=inter, intra_threads=intra
            )
            for name, (inter, intra) in layouts.items()
            for q, d in directories.items()
        }
        for round_ in range(args.rounds):
            rate, outputs["fairseq"] = fairseq_generate(data, checkpoint, args, threads)
            rates.setdefault((threads, "fairseq"), []).append(rate)
            for quantization, translator in translators.items():
                rate, outputs[quantization] = ctranslate2_translate(translator, sources, args)
                rates.setdefault((threads, quantization), []).append(rate)
            shown = ", ".join(f"{n} {r[-1]:.1f}" for (t, n), r in rates.items() if t == threads)
            print(f"{threads} threads, round {round_ + 1}: {shown}", flush=True)
            load.append(os.getloadavg()[0])
    report = header(args, checkpoint, load) + table(rates, outputs, references, args, len(sources))
    print(report)
    if args.out:
        args.out.write_text(report, encoding="utf-8")


def header(args, checkpoint, load):
    """The command, the versions and the machine's load (1-minute averages)."""
    import platform

    import ctranslate2
    import fairseq
    import torch

    updates = trained_updates(checkpoint)
    cpu = platform.processor() or platform.machine()
    return "\n".join(
        [
            "# Translation speed: CTranslate2 against fairseq-generate",
            "",
            f"Command: `python research/bench_ct2.py {' '.join(sys.argv[1:])}`",
            "",
            f"Model: transformer_natbias_iwslt_de_en (6+6 layers, d 256), {updates} updates on "
            "Multi30k De-En (SentencePiece 8,000, joint, tied). CTranslate2 "
            f"{ctranslate2.__version__}, fairseq {fairseq.__version__}, torch {torch.__version__}, "
            f"{cpu}, {os.cpu_count()} cores. Machine load (1-minute average) at the start and "
            f"after each round: {', '.join(f'{x:.1f}' for x in load)}.",
            "",
            "",
        ]
    )


def table(rates, outputs, references, args, sentences):
    ours = outputs["fairseq"]
    lengths = statistics.mean(len(h) for h in ours)
    limit = sum(len(h) >= MAX_LENGTH for h in ours)
    lines = [
        f"{sentences} sentences (test_2016_flickr), beam {args.beam}, batch {args.batch_size}, "
        f"{args.rounds} rounds per thread count; fairseq's hypotheses {lengths:.1f} pieces on "
        f"average, {limit} at the length limit ({MAX_LENGTH})",
        "",
        "| threads | engine | sentences/s, median (range) | ratio to fairseq, median (range) |",
        "|---|---|---|---|",
    ]
    for (threads, name), values in rates.items():
        ratios = [v / f for v, f in zip(values, rates[threads, "fairseq"])]
        engine = "fairseq-generate" if name == "fairseq" else f"CTranslate2 {name}"
        lines.append(
            f"| {threads} | {engine} "
            f"| {statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f}) "
            f"| {statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f}) |"
        )
    lines += ["", "| engine | same hypothesis as fairseq-generate | BLEU |", "|---|---|---|"]
    for name, hypotheses in outputs.items():
        same = sum(a == b for a, b in zip(hypotheses, ours)) / sentences
        engine = "fairseq-generate" if name == "fairseq" else f"CTranslate2 {name}"
        lines.append(f"| {engine} | {100 * same:.1f}% | {bleu(hypotheses, references):.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
