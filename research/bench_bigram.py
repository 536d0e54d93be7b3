"""Seconds per training update of ``--natbias-order 2`` against order 1 (the
default) and stock fairseq: the figure of docs/results.md's Cost section,
"1.025x order 1's at the IWSLT size with an 8k vocabulary"
(research/results/bigram_cost.md, its |V| 8k table).

The IWSLT preset's sizes (``transformer_natbias_iwslt_de_en``: d 256, FFN 256,
4 heads; 6+6 layers unless --layers), shared embeddings, dropout 0.1,
label-smoothed cross-entropy, Adam, on Multi30k De-En (joint SentencePiece
8k); stock is ``--arch transformer`` of the same sizes. The three arms are
built in one process as fairseq-train builds them (bench_overhead.py's
Variant) and train on the same batches: --warmup updates each, then the arms
alternate every --block updates, who goes first rotating. Printed: each arm's
median seconds per update with its interquartile range, its ratio to stock
and to order 1, and the median over batches of the per-batch ratio to order
1 ("paired", the steadier figure on a loaded machine).

bigram_cost.md's other tables (counting at WMT'14 size, |V| 32k on a
synthetic corpus, the residual timed alone) were made by this script's
earlier form, in the git history at commit 98d5798.

    .venv/bin/python research/bench_bigram.py --updates 21 --warmup 1 --block 3
"""

import argparse
import logging
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_overhead import Variant, pipeline, timed  # noqa: E402

COMMON = (
    "--cpu --seed 1 --optimizer adam --adam-betas (0.9,0.997) --lr 5e-4 "
    "--lr-scheduler inverse_sqrt --warmup-updates 4000 --num-workers 0 "
    "--criterion label_smoothed_cross_entropy --label-smoothing 0.1"
).split()
STOCK, ORDER1, ORDER2 = "stock transformer", "order 1 (default)", "order 2"
ARMS = {
    STOCK: ["--arch", "transformer"],
    ORDER1: ["--arch", "transformer_natbias_iwslt_de_en"],
    ORDER2: ["--arch", "transformer_natbias_iwslt_de_en", "--natbias-order", "2"],
}


def sizes(layers, dim, ffn, heads):
    return [
        *(f"--{side}-layers={layers}" for side in ("encoder", "decoder")),
        *(f"--{side}-embed-dim={dim}" for side in ("encoder", "decoder")),
        *(f"--{side}-ffn-embed-dim={ffn}" for side in ("encoder", "decoder")),
        *(f"--{side}-attention-heads={heads}" for side in ("encoder", "decoder")),
        "--dropout=0.1",
        "--share-all-embeddings",
    ]


def measure(data_bin, args, save_dir):
    """Per-arm medians and ratios, as a dict of rows keyed by arm."""
    common = [*COMMON, "--max-tokens", str(args.max_tokens)]
    model = sizes(args.layers, args.dim, args.ffn, args.heads)
    arms = {
        label: Variant(data_bin, model, common, options, save_dir)
        for label, options in ARMS.items()
    }
    batches = arms[ORDER1].batches("train", args.warmup + args.updates, args.max_tokens)
    warm, batches = batches[: args.warmup], batches[args.warmup :]
    for arm in arms.values():
        for sample in warm:
            arm.train_update(sample)
    labels = list(arms)
    times = {label: [0.0] * len(batches) for label in labels}
    for block, first in enumerate(range(0, len(batches), args.block)):
        turn = block % len(labels)
        for label in labels[turn:] + labels[:turn]:
            for i in range(first, min(first + args.block, len(batches))):
                times[label][i] = timed(arms[label].train_update, batches[i])
    rows = {}
    for label in labels:
        quartiles = statistics.quantiles(times[label], n=4) if len(batches) > 1 else [0.0] * 3
        rows[label] = {
            "median_s": statistics.median(times[label]),
            "iqr": (quartiles[0], quartiles[2]),
        }
    for label in labels:
        rows[label]["vs_stock"] = rows[label]["median_s"] / rows[STOCK]["median_s"]
        if label != STOCK:
            rows[label]["vs_order1"] = rows[label]["median_s"] / rows[ORDER1]["median_s"]
            paired = [a / b for a, b in zip(times[label], times[ORDER1])]
            rows[label]["paired_vs_order1"] = statistics.median(paired)
    tokens = statistics.mean(int(s["ntokens"]) for s in batches)
    return {"vocab": len(arms[ORDER1].task.target_dictionary), "tokens": tokens, "arms": rows}


def table(record):
    lines = [
        f"|V| = {record['vocab']:,}; {record['tokens']:.0f} target tokens per batch on average",
        "",
        "| arm | s/update, median [IQR] | vs stock | vs order 1 (paired) |",
        "|---|---:|---:|---:|",
    ]
    for label, row in record["arms"].items():
        low, high = row["iqr"]
        order1 = (
            f"{row['vs_order1']:.3f}x ({row['paired_vs_order1']:.3f}x)"
            if "vs_order1" in row
            else ""
        )
        lines.append(
            f"| {label} | {row['median_s']:.3f} [{low:.3f}, {high:.3f}] | "
            f"{row['vs_stock']:.3f}x | {order1} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--multi30k", default=os.environ.get("NATBIAS_MULTI30K", "../shared/data/multi30k")
    )
    parser.add_argument(
        "--workdir", default=os.path.join(tempfile.gettempdir(), "natbias-bench-bigram")
    )
    sizes = {"layers": 6, "dim": 256, "ffn": 256, "heads": 4, "max-tokens": 2048}
    for name, default in {**sizes, "warmup": 3, "updates": 20, "block": 4, "threads": 1}.items():
        parser.add_argument(f"--{name}", type=int, default=default)  # block: updates per arm
    args = parser.parse_args(argv)
    multi30k = Path(args.multi30k)
    if not (multi30k / "train.de.gz").exists():
        sys.exit(f"bench_bigram: Multi30k not found at {multi30k}; pass --multi30k DIR")
    torch.set_num_threads(args.threads)
    logging.disable(logging.INFO)
    workdir = Path(args.workdir)
    data_bin = pipeline.prepare(multi30k, workdir / "multi30k", vocab_size=8000, langs=("de", "en"))
    print(table(measure(data_bin, args, workdir / "no-checkpoint")))
    print(f"\ncommand: {sys.executable} {' '.join(sys.argv)}; torch {torch.__version__}")


if __name__ == "__main__":
    main()
