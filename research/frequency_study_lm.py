"""Where the natural bias acts, by training frequency, in a language model
(issue 105, item 4): frequency_study.py's binned loss difference for the
transformers language model of the existing set-up (research/hf_study.sh's
lm-en: examples/huggingface/language_model.py, a 2-layer GPT-2 of width 128,
Multi30k English, 1,000 updates, plain cross-entropy), stock against the
natural bias, seeds paired. Each run keeps update 200 (--keep: the head
start) and its best by validation NLL (the end); natbias-loss-by-frequency
scores both on test_2016_flickr, counts from the training text in the
model's tokens. Finished steps are skipped; --jobs runs side by side.

    OMP_NUM_THREADS=1 python research/frequency_study_lm.py --seeds 1 2 3 \\
        --workdir /work/study105/lm-en --results research/results
"""

import gzip
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "research"))
import frequency_study as frequency  # noqa: E402  (the combining over seeds and the plot)
from study import parser_for  # noqa: E402

ARMS = {"stock": "none", "natbias": "natural"}  # run folder -> language_model.py's --bias
POINTS = {"early": "update-{early}", "end": "best"}  # point -> the run's model folder


def run(command, log):
    with open(log, "a", encoding="utf-8") as out:
        if subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode:
            raise SystemExit(f"frequency_study_lm: {command[1]} failed; see {log}")


def train(args, arm, seed):
    folder = args.workdir / "runs" / arm / f"seed{seed}"
    if (folder / "done").exists():
        return
    frequency.say(f"lm-{args.lang} {arm} seed{seed}: training, {args.max_steps} updates")
    folder.mkdir(parents=True, exist_ok=True)
    script = REPO / "examples" / "huggingface" / "language_model.py"
    run(
        [sys.executable, str(script), "--data", args.multi30k, "--lang", args.lang,
         "--work", str(args.workdir), "--bias", ARMS[arm], "--seed", str(seed),
         "--max-steps", str(args.max_steps), "--keep", str(args.early_update)],
        args.workdir / f"train_{arm}_seed{seed}.log",
    )  # fmt: skip


def score(args, seed, point):
    out = args.workdir / "by_frequency" / f"seed{seed}" / point
    if (out / "loss_by_frequency.csv").exists():
        return
    frequency.say(f"lm-{args.lang} seed{seed}: loss by frequency against stock, {point}")
    models = [
        args.workdir / "runs" / arm / f"seed{seed}" / POINTS[point].format(early=args.early_update)
        for arm in ARMS
    ]
    text = args.workdir / "text"
    command = [
        str(Path(sys.executable).parent / "natbias-loss-by-frequency"),
        *map(str, models),
        "--text", str(text / f"test.{args.lang}"),
        "--train-text", str(text / f"train.{args.lang}"),
        "--cpu", "--out-dir", str(out),
    ]  # fmt: skip
    output = subprocess.run(command, capture_output=True, text=True)
    if output.returncode:
        raise SystemExit(f"frequency_study_lm: {output.stderr.strip()}")
    kl = {m[1]: float(m[2]) for m in map(frequency.KL_LINE.match, output.stdout.splitlines()) if m}
    (out / "kl.json").write_text(json.dumps(kl) + "\n")


def report(args):
    name = f"lm-{args.lang}"
    lines = [
        f"# Where the natural bias acts, by training frequency: a language model, Multi30k {args.lang}",
        "",
        f"Written by `research/frequency_study_lm.py`; command: `python {' '.join(sys.argv)}`.",
        "",
        "Set-up: examples/huggingface/language_model.py (2-layer GPT-2, d 128, blocks of 64 tokens, "
        f"{args.max_steps:,} updates, plain cross-entropy), CPU; early = update "
        f"{args.early_update}, end = the best checkpoint by validation NLL. Differences are "
        "natbias − stock of the same seed, bits per token of test_2016_flickr (each sentence "
        "scored on its own after the start token), binned by the token's count in the training "
        "text; mean ± standard error over the seeds named. Negative: the natural bias is better.",
    ]
    plotted = {}
    for point in POINTS:
        folder = args.workdir / "by_frequency"
        seeds, combined, kls = frequency.read_comparison(folder, args.seeds, point)
        if not seeds:
            continue
        plotted[(name, point, "natbias")] = combined
        lines += [
            "",
            f"## {point}: natbias − stock (seeds {', '.join(map(str, seeds))})",
            "",
            *frequency.difference_table("natbias", kls, combined),
        ]
    path = Path(args.results) / f"frequency_study_{name}.md"
    if plotted:
        png = frequency.plot(plotted, [name], path.with_suffix(".png"))
        lines += ["", f"![binned median difference]({png.name})"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def main():
    parser = parser_for(__doc__)
    parser.add_argument("--lang", default="en")
    parser.add_argument("--workdir", type=Path, default=Path("work/frequency_study_lm"))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--max-steps", type=int, default=1000)
    parser.add_argument("--early-update", type=int, default=200, help="a multiple of 50")
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side")
    parser.add_argument("--results", default="research/results")
    args = parser.parse_args()
    args.workdir = args.workdir.resolve()
    (args.workdir / "text").mkdir(parents=True, exist_ok=True)
    for split, name in (("train", "train"), ("test_2016_flickr", "test")):
        plain = args.workdir / "text" / f"{name}.{args.lang}"
        if not plain.exists():  # the scorer reads plain text
            with gzip.open(Path(args.multi30k) / f"{split}.{args.lang}.gz", "rt") as source:
                plain.write_text(source.read(), encoding="utf-8")
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        runs = [(arm, seed) for seed in args.seeds for arm in ARMS]
        train(
            args, *runs[0]
        )  # alone: it trains the tokenizer every run shares, which two would race
        [job.result() for job in [pool.submit(train, args, *run) for run in runs[1:]]]
        jobs = [pool.submit(score, args, seed, point) for seed in args.seeds for point in POINTS]
        [job.result() for job in jobs]
    frequency.say(f"report: {report(args)}")


if __name__ == "__main__":
    main()
