"""Where the natural bias acts, by training frequency (issue 105, item 4).

Multi30k De->En and Fr->En, the project's 3,000-pair screening set-up (the
small model, the short schedule, 2,000 updates, validation every 100, best
checkpoint by validation NLL: research/studies/small_corpora.md), three arms
of research/study_learning_efficiency.py, each trained through the real
fairseq-train with the same run arguments (study.runs.training_arguments):

    stock                     fairseq's transformer
    gain/unigram              the package's default (the unigram bias, the
                              learnt gain capped at 1, G0 0.05, C 20)
    gain/unigram+unigram-ls   the same, trained with label smoothing towards
                              the unigram

Each run keeps two checkpoints: update --early-update (the head start) and
the best (the end, the model a user keeps). Then, per arm against stock of
the same seed, at both points: natbias-loss-by-frequency on the test set
(per training-count bin, the paper's edges: the median and mean per-token
loss difference, tokens; each model's KL of its average prediction from the
training unigram); at the end, fairseq-generate beam 5 (pieces, not
detokenised) and natbias-output-frequency per arm. Over seeds: mean and
standard error per bin, to --results/frequency_study_<size>.md and a plot.

Every run goes to --early-update first (all seeds), then on to the end
(fairseq resumes; `--stages early` stops at the head start); each step is
skipped when its output exists, so the study stops and resumes anywhere;
--jobs runs side by side.

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python research/frequency_study.py \\
        --train-pairs 3000 --seeds 1 2 3 --workdir /work/study105 --results research/results
"""

import csv
import json
import math
import os
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "research"))  # the study package, research/study/
sys.path.insert(0, str(REPO / "examples" / "paper"))  # make demo's pipeline

import numpy as np  # noqa: E402
import pipeline  # noqa: E402
from pipeline import say  # noqa: E402
from study import parser_for  # noqa: E402
from study.arms import (  # noqa: E402
    REFERENCE_ARM,
    Arm,
    Translation,
    converge_options,
    first_pairs,
    vocabulary_for,
)
from study.runs import training_arguments  # noqa: E402

ARMS = ("stock", "gain/unigram", "gain/unigram+unigram-ls")
# Update 200: the schedule's warm-up peaks at update 100, and the natural bias's
# lead is largest over the first few hundred updates (stock's NLL at update
# 1,000 is reached at 600-700: small_corpora.md), so 200 sees the head start
# after the learning rate has peaked but well before stock catches up; it is
# on the 100-update save grid the screening uses.
EARLY_UPDATE = 200
STEPS, STAGES = ["train", "score", "report"], ["early", "end"]
DIFFERENCES = ("median_difference_bits", "mean_difference_bits")  # per bin, as tabled
KL_LINE = re.compile(r"^(baseline|model) .*KL\(average prediction \|\| training unigram\) ([\d.]+)")


# --- running ---------------------------------------------------------------


def prepare(pair, args):
    """The pair's task (the screening's options) and its data-bin."""
    task = Translation(pair)
    task.options = [*converge_options(task.options, task.loss_key), "--patience", "0"]
    raw = Path(args.multi30k)
    if args.train_pairs:
        task.folder = f"{pair}_n{args.train_pairs}"
        task.vocab_size = vocabulary_for(args.train_pairs)
    work = Path(args.workdir).resolve() / task.folder
    work.mkdir(parents=True, exist_ok=True)
    if args.train_pairs:
        raw = first_pairs(raw, work / "raw", task.langs, args.train_pairs)
    return task, work, task.prepare(raw, work)


def run_dir(work, arm, seed):
    return work / "runs" / arm.folder / f"seed{seed}"


def checkpoint(work, arm, seed, point):
    return run_dir(work, arm, seed) / (
        "checkpoint_early.pt" if point == "early" else "checkpoint_best.pt"
    )


def train(task, work, data_bin, arm, seed, args, stage):
    """One run to the head start's update (``stage`` "early": its checkpoint
    kept as checkpoint_early.pt) or on from there to the end ("end"; fairseq
    resumes from checkpoint_last.pt, as an interrupted study run does). Two
    stages so that the head start of every run is measured first on a busy CPU."""
    folder = run_dir(work, arm, seed)
    name = f"{task.folder} {arm.name} seed{seed}"
    early = folder / "checkpoint_early.pt"
    if early.exists() and (stage == "early" or (folder / "done").exists()):
        return
    folder.mkdir(parents=True, exist_ok=True)
    updates = args.early_update if stage == "early" else args.max_update
    arguments = training_arguments(task, data_bin, folder, arm, seed, args)
    arguments[arguments.index("--max-update") + 1] = str(updates)
    # every interval checkpoint kept until the run ends (the study keeps one)
    arguments[arguments.index("--keep-interval-updates") + 1] = "-1"
    say(f"{name}: training to update {updates}")

    def progress(record):
        say(f"{name}: update {record.num_updates} valid NLL {record.values[task.loss_key]:.3f}")

    if not sorted(folder.glob(f"checkpoint_*_{args.early_update}.pt")) or stage == "end":
        on_line = pipeline.on_validation(task.loss_key, progress)
        if stage == "end":
            pipeline.train(arguments, folder, on_line)  # marks the run done
        else:
            pipeline.record_step0(arguments, folder / "step0.json")
            pipeline.run(
                [*pipeline.tool("fairseq-train"), *arguments], folder / "train.log", on_line
            )
    kept = sorted(folder.glob(f"checkpoint_*_{args.early_update}.pt"))
    if not early.exists():
        if not kept:
            raise SystemExit(
                f"frequency_study: {folder} has no checkpoint of update {args.early_update}"
            )
        shutil.copy(kept[0], early)
    if stage == "end":
        for interval in folder.glob("checkpoint_*_*.pt"):
            interval.unlink()
    say(f"{name}: trained to update {updates}")


def generate_and_count(task, work, data_bin, arm, seed):
    """fairseq-generate beam 5 on the test set (pieces), then natbias-output-frequency."""
    folder = run_dir(work, arm, seed)
    name = f"{task.folder} {arm.name} seed{seed}"
    generated = folder / "generate-test.txt"
    if not generated.exists():
        say(f"{name}: fairseq-generate beam 5, test set")
        decoding = list(pipeline.TEST_DECODING)
        del decoding[decoding.index("--remove-bpe") : decoding.index("--remove-bpe") + 2]
        output = pipeline.run(
            [
                *pipeline.tool("fairseq-generate"),
                str(data_bin),
                "--user-dir",
                "fairseq_natbias",
                "--path",
                str(folder / "checkpoint_best.pt"),
                *decoding,
                "--cpu",
            ]
        )
        generated.with_suffix(".part").write_text(output, encoding="utf-8")
        generated.with_suffix(".part").rename(generated)
    out = folder / "output_frequency"
    if not (out / "output_frequency.csv").exists():
        say(f"{name}: natbias-output-frequency")
        pipeline.run(
            [
                *pipeline.tool("natbias-output-frequency"),
                str(generated),
                "--train-text",
                str(work / "text" / f"train.{task.langs[1]}"),
                "--out-dir",
                str(out),
            ]
        )


def loss_by_frequency(task, work, data_bin, arm, seed, point):
    """natbias-loss-by-frequency, stock against ``arm`` (same seed) at ``point``."""
    out = work / "by_frequency" / arm.folder / f"seed{seed}" / point
    if (out / "loss_by_frequency.csv").exists():
        return
    say(f"{task.folder} {arm.name} seed{seed}: loss by frequency against stock, {point}")
    stock = Arm.parse(REFERENCE_ARM)
    output = pipeline.run(
        [
            *pipeline.tool("natbias-loss-by-frequency"),
            str(checkpoint(work, stock, seed, point)),
            str(checkpoint(work, arm, seed, point)),
            "--data",
            str(data_bin),
            "--gen-subset",
            "test",
            "--cpu",
            "--out-dir",
            str(out),
        ]
    )
    kl = {m[1]: float(m[2]) for m in map(KL_LINE.match, output.splitlines()) if m}
    (out / "kl.json").write_text(json.dumps(kl) + "\n")


# --- combining over seeds ----------------------------------------------------


def read_csv(path):
    with open(path, encoding="utf-8") as source:
        return list(csv.DictReader(source))


def mean_and_error(values):
    """Mean and standard error (sample s.d. / sqrt(n); nan for one value) of the finite values."""
    values = np.asarray([v for v in values if v is not None and math.isfinite(v)], np.float64)
    if len(values) == 0:
        return math.nan, math.nan
    error = values.std(ddof=1) / math.sqrt(len(values)) if len(values) > 1 else math.nan
    return float(values.mean()), float(error)


def combine_bins(per_seed, keys):
    """Per bin (the rows of each seed's CSV, in the same bin order), ``keys``'
    mean and standard error over seeds; the bin's label, its token count (the
    first seed's) and how many seeds gave it a value."""
    combined = []
    for rows in zip(*per_seed):
        labels = {row["bin"] for row in rows}
        if len(labels) != 1:
            raise SystemExit(f"frequency_study: seeds disagree on the bins: {sorted(labels)}")
        out = {"bin": rows[0]["bin"], "tokens": rows[0].get("tokens") or rows[0].get("reference")}
        if rows[0].get("few") == "True":  # the tool's mark: too few tokens to read much into
            out["bin"] += " (few)"
        for key in keys:
            values = [float(row[key]) if row.get(key) not in (None, "") else None for row in rows]
            out[key] = mean_and_error(values)
            out[key + "_seeds"] = sum(v is not None for v in values)
        combined.append(out)
    return combined


def cell(pair, signed=True):
    mean, error = pair
    if math.isnan(mean):
        return ""
    return f"{mean:{'+' if signed else ''}.3f}" + ("" if math.isnan(error) else f" ± {error:.3f}")


def output_csv(work, arm, seed):
    return run_dir(work, arm, seed) / "output_frequency" / "output_frequency.csv"


def read_comparison(folder, seeds, point):
    """One comparison from FOLDER/seed<k>/<point>/: the ``seeds`` scored there,
    their bins combined, and each one's KLs."""
    seeds = [s for s in seeds if (folder / f"seed{s}" / point / "kl.json").exists()]
    per_seed = [read_csv(folder / f"seed{s}" / point / "loss_by_frequency.csv") for s in seeds]
    kls = [json.loads((folder / f"seed{s}" / point / "kl.json").read_text()) for s in seeds]
    return seeds, combine_bins(per_seed, DIFFERENCES), kls


def difference_table(name, kls, combined):
    """One comparison's Markdown: both models' KL from the unigram, then each bin."""
    kl = [cell(mean_and_error([k.get(m) for k in kls]), False) for m in ("baseline", "model")]
    return [
        f"KL(average prediction ‖ training unigram), bits: stock {kl[0]}, {name} {kl[1]}",
        "",
        "| training count | tokens | median difference | mean difference |",
        "|---|---|---|---|",
        *(
            f"| {row['bin']} | {row['tokens']} | {cell(row[DIFFERENCES[0]])} | {cell(row[DIFFERENCES[1]])} |"
            for row in combined
            if row["tokens"] != "0"  # bins the test set leaves empty
        ),
    ]


def report(pairs, arms, args):
    """The Markdown results and the plot; returns the Markdown's path."""
    size = f"{args.train_pairs}" if args.train_pairs else "29000"
    lines = [
        f"# Where the natural bias acts, by training frequency: Multi30k, {int(size):,} pairs",
        "",
        f"Written by `research/frequency_study.py`; command: `{' '.join(['python', *sys.argv])}`.",
        "",
        f"Set-up: the 3,000-pair screening's (2+2 transformer, short schedule, {args.max_update:,} "
        f"updates, best checkpoint by validation NLL), CPU; early = update {args.early_update}, "
        "end = the best checkpoint. Differences are model − stock of the same seed, bits per "
        "reference token of the test set (test_2016_flickr), binned by the token's count in the "
        "training targets; mean ± standard error over the seeds named. Negative: the arm is better.",
    ]
    if not args.train_pairs and "end" in args.stages:
        lines += [
            "",
            f"At 29,000 pairs {args.max_update:,} updates is **not convergence** (the full-corpus "
            "runs of small_corpora.md go on to 20,000): these are mid-training models.",
        ]
    plotted = {}
    for pair, (_, work, _) in pairs.items():
        lines += [
            "",
            f"## {pair}",
            "",
            f"Validation NLL (bits) at update {args.early_update} and at the best checkpoint, "
            "to set beside the screening's run records (research/results/runs/):",
            "",
        ]
        for arm in arms:
            early, best = zip(
                *(valid_nll(run_dir(work, arm, s), args.early_update) for s in args.seeds)
            )
            lines.append(
                f"- {arm.name}: update {args.early_update} {measured(early)}, best {measured(best)}"
            )
        for point in ("early", "end"):
            for arm in arms:
                if arm.name == REFERENCE_ARM:
                    continue
                folder = work / "by_frequency" / arm.folder
                seeds, combined, kls = read_comparison(folder, args.seeds, point)
                if not seeds:
                    continue
                plotted[(pair, point, arm.name)] = combined
                lines += [
                    "",
                    f"### {pair}, {point}: {arm.name} − stock (seeds {', '.join(map(str, seeds))})",
                    "",
                    *difference_table(arm.name, kls, combined),
                ]
        generated = {a: [s for s in args.seeds if output_csv(work, a, s).exists()] for a in arms}
        done = [a for a in arms if generated[a]]
        if done:
            by_arm = {
                a.name: combine_bins(
                    [read_csv(output_csv(work, a, s)) for s in generated[a]], ("ratio",)
                )
                for a in done
            }
            lines += [
                "",
                f"### {pair}, end: tokens produced / tokens in the references (beam 5, test set)",
                "",
                "| training count | reference tokens | "
                + " | ".join(f"{a.name} (seeds {', '.join(map(str, generated[a]))})" for a in done)
                + " |",
                "|---|---|" + "---|" * len(done),
            ]
            first = by_arm[done[0].name]
            for k, row in enumerate(first):
                lines += (
                    []
                    if row["tokens"] == "0"
                    else [
                        f"| {row['bin']} | {row['tokens']} | "
                        + " | ".join(cell(by_arm[a.name][k]["ratio"], signed=False) for a in done)
                        + " |"
                    ]
                )
    if not any(point == "end" for _, point, _ in plotted):
        why = "`--stages early`" if "end" not in args.stages else "yet"
        lines += ["", f"The end (best checkpoint) and the output frequency: **not run** ({why})."]
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"frequency_study_{size}.md"
    if plotted:
        png = plot(plotted, list(pairs), results / f"frequency_study_{size}.png")
        lines += ["", f"![binned median difference]({png.name})"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def measured(values):
    """Mean ± s.e. of the values given and their number, or "not run"."""
    n = sum(v is not None for v in values)
    return f"{cell(mean_and_error(values), False)} ({n} seed{'s' * (n > 1)})" if n else "not run"


def valid_nll(folder, update):
    """A run's validation NLL (bits) at ``update`` and its lowest (None before it ends)."""
    if not (folder / "train.log").exists() or not (folder / "step0.json").exists():
        return None, None
    curve = pipeline.validation_curve(folder, "nll_loss")
    return curve.get(update), min(curve.values()) if (folder / "done").exists() else None


def plot(plotted, pairs, path):
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # no font search in the log
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(pairs), 2, figsize=(11, 4 * len(pairs)), squeeze=False)
    for i, pair in enumerate(pairs):
        for j, point in enumerate(("early", "end")):
            ax = axes[i][j]
            shown_arms = [
                (key[2], rows) for key, rows in plotted.items() if key[:2] == (pair, point)
            ]
            for k, (arm, rows) in enumerate(shown_arms):
                shown = [r for r in rows if not math.isnan(r["median_difference_bits"][0])]
                x = np.arange(len(shown)) + (k - 0.5) * 0.15
                mean = [r["median_difference_bits"][0] for r in shown]
                error = [np.nan_to_num(r["median_difference_bits"][1]) for r in shown]
                ax.errorbar(x, mean, yerr=error, marker="o", capsize=3, label=arm)
                ax.set_xticks(np.arange(len(shown)), [r["bin"] for r in shown], rotation=45)
            ax.axhline(0, color="black", linewidth=0.8)
            ax.set_title(f"{pair}, {point}")
            ax.set_xlabel("training count of the reference token")
            ax.set_ylabel("median loss difference, arm − stock (bits)")
            if shown_arms:
                ax.legend(fontsize="small")
            else:
                ax.text(0.5, 0.5, "not run", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --- the plan ----------------------------------------------------------------


def main():
    parser = parser_for(__doc__)
    parser.add_argument("--workdir", default="work/frequency_study")
    parser.add_argument(
        "--pairs", nargs="+", default=["de-en", "fr-en"], choices=["de-en", "fr-en"]
    )
    parser.add_argument("--arms", nargs="+", default=list(ARMS), help="stock first")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument(
        "--train-pairs", type=int, metavar="N", help="the first N pairs (default: all 29,000)"
    )
    parser.add_argument("--max-update", type=int, default=2000)
    parser.add_argument("--validate-every", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=1500)
    parser.add_argument("--early-update", type=int, default=EARLY_UPDATE, help="head start's")
    parser.add_argument("--steps", nargs="+", default=STEPS, choices=STEPS)
    parser.add_argument("--stages", nargs="+", default=STAGES, choices=STAGES, help="see above")
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side")
    parser.add_argument("--results", default="research/results")
    args = parser.parse_args()
    if args.early_update % args.validate_every:
        raise SystemExit("frequency_study: --early-update must be a multiple of --validate-every")
    arms = [Arm.parse(text) for text in args.arms]
    if arms[0].name != REFERENCE_ARM:
        raise SystemExit("frequency_study: the first arm must be stock (the baseline)")
    os.chdir(REPO)  # fairseq's --user-dir fairseq_natbias is relative
    training = SimpleNamespace(
        schedule="short",
        max_tokens=args.max_tokens,
        validate_every=args.validate_every,
        train_pairs=args.train_pairs,
        max_update=args.max_update,
        early_update=args.early_update,
    )
    pairs = {pair: prepare(pair, args) for pair in args.pairs}
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:

        def each(seed, function, *extra, when=None):
            jobs = [
                pool.submit(function, task, work, data_bin, arm, seed, *extra)
                for task, work, data_bin in pairs.values()
                for arm in arms
                if when is None or when(work, arm, seed)
            ]
            for job in jobs:
                job.result()

        def compared(point):
            name = "checkpoint_early.pt" if point == "early" else "done"
            return lambda work, arm, seed: (
                arm.name != REFERENCE_ARM
                and all((run_dir(work, a, seed) / name).exists() for a in (arms[0], arm))
            )

        for stage in args.stages:
            for seed in args.seeds:
                if "train" in args.steps:
                    each(seed, train, training, stage)
                if "score" in args.steps:
                    if stage == "end":
                        each(
                            seed,
                            generate_and_count,
                            when=lambda w, a, s: (run_dir(w, a, s) / "done").exists(),
                        )
                    each(seed, loss_by_frequency, stage, when=compared(stage))
                if "report" in args.steps:
                    say(f"report: {report(pairs, arms, args)}")


if __name__ == "__main__":
    main()
