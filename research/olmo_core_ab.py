"""The A/B in OLMo-core: an OLMo-core preset trained from scratch as OLMo-core
trains it (examples/olmo_core/pretrain.py: AdamW, warm-up then cosine, its
Trainer), stock against the natural bias, on Multi30k English, paired by
seed (the same initial weights but the head's b and gain, the same batches).
Two runs side by side, one thread each.

    OMP_NUM_THREADS=1 python research/olmo_core_ab.py --preset olmo2_1M --seeds 0 1 2 \\
        --steps 1000 --out research/results/olmo_core_ab_1M.md

Figures, per seed and their mean: the validation cross-entropy (bits per
target token) at step 0 and at the end; the steps the natural bias takes to
reach stock's validation loss at 25 %, 50 % and 100 % of the budget (the
first evaluation at or below it; "-" where it never does). Each run's record:
runs/olmo_core_<preset>/<arm>/seed<k>.json beside the --out file.
"""

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PRETRAIN = REPO / "examples/olmo_core/pretrain.py"
ARMS = ("stock", "natural")


def run(arm, seed, args, data, records) -> dict:
    record = records / arm / f"seed{seed}.json"
    if not record.exists():
        out = Path(args.work) / f"{arm}-seed{seed}"
        command = [sys.executable, str(PRETRAIN), "--arm", arm, "--out", str(out)]
        command += ["--data", str(data), "--preset", args.preset, "--seed", str(seed)]
        command += ["--steps", str(args.steps), "--warmup", str(args.warmup), "--lr", str(args.lr)]
        command += ["--eval-every", str(args.eval_every), "--batch", str(args.batch)]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text((out / "results.json").read_text())
    result = json.loads(record.read_text())
    result["validation_bits"] = {int(k): v for k, v in result["validation_bits"].items()}
    return result


def steps_to_reach(curve: dict, target: float):
    return next((step for step in sorted(curve) if curve[step] <= target), None)


def summarise(runs: dict, args) -> str:
    seeds, end = args.seeds, args.steps
    every = args.eval_every
    marks = {f"{p} %": min(end, round(end * p / 100 / every) * every) for p in (25, 50, 100)}
    first = runs["stock", seeds[0]]
    lines = [
        f"# OLMo-core {args.preset}: stock against the natural bias (Multi30k English)",
        "",
        f"`{' '.join(sys.argv)}` (research/olmo_core_ab.py). {first['parameters']:,} parameters; "
        f"{first['train_tokens']:,} training tokens (SentencePiece, 1,000 pieces; the output layer "
        f"padded to 1,024); {end} steps of {args.batch} x {first['seq_len']} tokens; AdamW lr "
        f"{args.lr:g}, betas (0.9, 0.95), weight decay 0.1 (none on embeddings, b, g), "
        f"{args.warmup} warm-up steps then cosine; validation: Multi30k's 1,014 validation "
        "sentences, bits per target token, every "
        f"{args.eval_every} steps. One thread per run, two runs side by side, a 2-core CPU.",
        "",
        "| seed | step 0 stock | step 0 natural | "
        + " | ".join(f"steps to stock's {m} ({s})" for m, s in marks.items())
        + " | end stock | end natural |",
        "|---|---|---|" + "---|" * len(marks) + "---|---|",
    ]
    means = []
    for seed in seeds:
        stock, natural = runs["stock", seed], runs["natural", seed]
        s, n = stock["validation_bits"], natural["validation_bits"]
        reach = [steps_to_reach(n, s[step]) for step in marks.values()]
        row = [s[0], n[0], *reach, s[end], n[end]]
        means.append(row)
        cells = [
            f"{v:.4f}" if isinstance(v, float) else ("-" if v is None else str(v)) for v in row
        ]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    # a mean only where every seed reached the target
    mean = [None if None in column else sum(column) / len(column) for column in zip(*means)]
    cells = [
        "-" if v is None else (f"{v:.4f}" if i in (0, 1, 5, 6) else f"{v:.0f}")
        for i, v in enumerate(mean)
    ]
    lines.append("| mean | " + " | ".join(cells) + " |")
    lines += ["", "Validation bits along the run (mean over seeds):", ""]
    lines += ["| step | stock | natural |", "|---|---|---|"]
    for step in sorted(first["validation_bits"]):
        if step % (args.eval_every * 5) == 0 or step == end:
            vals = [
                sum(runs[arm, seed]["validation_bits"][step] for seed in seeds) / len(seeds)
                for arm in ARMS
            ]
            lines.append(f"| {step} | {vals[0]:.4f} | {vals[1]:.4f} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="olmo2_1M")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--lr", type=float, default=4e-3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--work", default="/tmp/olmo_core_ab")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    records = args.out.parent / "runs" / f"olmo_core_{args.preset}"
    data = Path(args.work) / "data"
    if not (data / "train.npy").exists():
        sys.path.insert(0, str(PRETRAIN.parent))
        from pretrain import tokenise_multi30k

        tokenise_multi30k(Path(args.work), 1000)
    jobs = [(arm, seed) for seed in args.seeds for arm in ARMS]
    with ThreadPoolExecutor(args.jobs) as pool:
        done = pool.map(lambda job: run(*job, args, data, records), jobs)
        runs = dict(zip(jobs, done))
    args.out.write_text(summarise(runs, args))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
