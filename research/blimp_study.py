"""Does the natural bias change a language model's BLiMP frequency bias (seed
003, "Rare Word Representation Learning by Smoothing Over Word Classes",
sec. 4.1 and App. E)? The transformers language model of research/hf_study.sh's
lm-en (examples/huggingface/language_model.py: a 2-layer GPT-2 of width 128,
Multi30k English, 1,000 updates, validation every 50), per arm and seed, its
models of --keep's updates and its best by validation NLL scored on all of
BLiMP by natbias-frequency-bias (the 67 files, one call each; training counts
from Multi30k's English training text in the model's tokens).

Arms: stock (--bias none), natbias (--bias natural), natbias+unigram-ls (the
natural bias with label smoothing towards the unigram, 0.1). Every step is a
job of its own, done once (a run's ``done``, a score's CSV): an interrupted
study resumes where it stopped. --jobs runs side by side (2 at most here); the
scores of update 200 and of the best come before the other updates' (the
curve), so that a study cut short has its table first::

    OMP_NUM_THREADS=1 nice -n 10 python research/blimp_study.py run --seeds 1 2 3 \\
        --arms stock natbias natbias+unigram-ls --workdir work/blimp_study
    python research/blimp_study.py report --workdir work/blimp_study \\
        --out research/results/blimp_frequency_bias.md
"""

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
LANG = "en"
ARMS = {  # run folder -> language_model.py's arguments
    "stock": ["--bias", "none"],
    "natbias": ["--bias", "natural"],
    "natbias+unigram-ls": ["--bias", "natural", "--label-smoothing", "unigram"],
}
# fairseq's transformer_lm_natbias set-up: research/study_learning_efficiency.py's lm-en
# (2 layers, d 128, SentencePiece 8,000, blocks of 64, the short schedule, 1,000
# updates), its arm of each name; scored with --data and --spm.
FAIRSEQ_ARMS = {
    "fairseq-stock": "stock",
    "fairseq-natbias": "gain/unigram",
    "fairseq-natbias+unigram-ls": "gain/unigram+unigram-ls",  # fairseq's criterion, eps 0.1
}
ARMS.update({arm: None for arm in FAIRSEQ_ARMS})
KEEP = (0, 100, 200, 400, 600, 800, 1000)  # models kept for the curve (multiples of 50)
EARLY = 200  # the head start
FIRST = (EARLY, "best")  # scored before the rest of KEEP


# Arms the issue names that this study has not run (2 shared cores, one evening): why,
# and what each would take, from the times measured here.
NOT_RUN = [
    "Not run: OLMo-core's olmo2_14M A/B (research/olmo_core_ab.py; its models to be scored after "
    "`natbias.olmo_core.to_hf`, not tried): 6 to 9 trainings and 12 to 18 scorings. Run: "
    "stock, natbias and natbias+unigram-ls (label smoothing 0.1 towards the unigram) in "
    "transformers, stock, natbias and natbias+unigram-ls (its criterion, eps 0.1) in fairseq, "
    "over 3 seeds at update 200 and the best "
    "(natbias+unigram-ls: 16 to 18 minutes a training; fairseq: 3 to 6 minutes a training, 3 to "
    "8 minutes a scoring, two side by side), and seed 1's transformers curve of stock and "
    "natbias at the updates shown."
]


def say(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_folder(args, arm, seed) -> Path:
    if arm in FAIRSEQ_ARMS:
        folder = FAIRSEQ_ARMS[arm].replace("/", "-")  # study.arms.Arm.folder
        return args.workdir / "fairseq" / "lm-en" / "short" / folder / f"seed{seed}"
    return args.workdir / "lm-en" / "runs" / arm / f"seed{seed}"


def best_update(args, arm, seed):
    if arm in FAIRSEQ_ARMS:  # the update fairseq saved checkpoint_best.pt at
        import torch

        path = run_folder(args, arm, seed) / "checkpoint_best.pt"
        state = torch.load(path, map_location="cpu", weights_only=False)
        return state["optimizer_history"][-1]["num_updates"]
    record = json.loads((run_folder(args, arm, seed) / "record.json").read_text())
    return record["best_update"]


def fairseq_model(args, arm, seed, update):
    """The checkpoint of ``update`` (kept by the study's --keep-updates), else the best."""
    folder = run_folder(args, arm, seed)
    kept = sorted(folder.glob(f"checkpoint_*_{update}.pt"))
    return kept[0] if kept else folder / "checkpoint_best.pt"


class Job:
    def __init__(self, name, needs, done, work):
        self.name, self.needs, self.done, self.work = name, needs, done, work


def train_job(args, arm, seed, needs=()):
    folder = run_folder(args, arm, seed)

    def work():
        if arm in FAIRSEQ_ARMS:
            return train_fairseq(args, arm, seed)
        command = [
            sys.executable, str(REPO / "examples/huggingface/language_model.py"),
            "--data", args.multi30k, "--lang", LANG, "--work", str(args.workdir / "lm-en"),
            *ARMS[arm], "--seed", str(seed), "--max-steps", str(args.max_steps),
            "--keep", *map(str, KEEP),
        ]  # fmt: skip
        log = args.workdir / f"train_{arm}_seed{seed}.log"
        with open(log, "a", encoding="utf-8") as out:
            if subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode:
                raise RuntimeError(f"training {arm} seed {seed} failed: see {log}")

    job = Job(f"train {arm} seed{seed}", needs, lambda: (folder / "done").exists(), work)
    job.arm = arm
    return job


def train_fairseq(args, arm, seed):
    command = [
        sys.executable, str(REPO / "research/study_learning_efficiency.py"), "--task", "lm",
        "--lang", LANG, "--arms", FAIRSEQ_ARMS[arm], "--seeds", str(seed), "--jobs", "1",
        "--multi30k", args.multi30k, "--workdir", str(args.workdir / "fairseq"),
        "--max-update", str(args.max_steps), "--keep-updates", str(EARLY),
    ]  # fmt: skip
    log = args.workdir / f"train_{arm}_seed{seed}.log"
    with open(log, "a", encoding="utf-8") as out:
        if subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO).returncode:
            raise RuntimeError(f"training {arm} seed {seed} failed: see {log}")


def score_path(args, arm, seed, update) -> Path:
    return args.workdir / "blimp" / arm / f"seed{seed}" / f"update-{update}.csv"


def score_job(args, arm, seed, point, trained):
    """natbias-frequency-bias on the run's model of ``point`` (an update, or
    best: its update is the record's, scored once whichever asks)."""
    update = lambda: best_update(args, arm, seed) if point == "best" else point  # noqa: E731

    def work():
        n = update()
        folder = run_folder(args, arm, seed)
        model = folder / f"update-{n}" if (folder / f"update-{n}").exists() else folder / "best"
        counts = ["--train-text", str(Path(args.multi30k) / f"train.{LANG}.gz")]
        if arm in FAIRSEQ_ARMS:  # the training split of its data-bin, its SentencePiece
            model, lm = fairseq_model(args, arm, seed, n), args.workdir / "fairseq" / "lm-en"
            counts = ["--data", str(lm / "data-bin"), "--spm", str(lm / "spm.model")]
        out = score_path(args, arm, seed, n)
        out.parent.mkdir(parents=True, exist_ok=True)
        command = [
            str(Path(sys.executable).parent / "natbias-frequency-bias"), args.blimp, str(model),
            *counts, "--cpu", "--csv", str(out.with_suffix(".tmp")),
        ]  # fmt: skip
        started = time.time()
        with open(out.with_suffix(".log"), "w+", encoding="utf-8") as log:
            child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(child.pid, 0)  # its own CPU time, not the other jobs'
            child.returncode = os.waitstatus_to_exitcode(status)
            log.seek(0)
            output = log.read()
        if child.returncode:
            raise RuntimeError(f"scoring {model} failed: {output.strip()[-2000:]}")
        cpu = usage.ru_utime + usage.ru_stime
        stdout = "".join(line for line in output.splitlines(True) if "sentences/s" not in line)
        out.with_suffix(".txt").write_text(
            stdout + f"cpu_seconds: {cpu:.0f}\nseconds: {time.time() - started:.0f}\n"
        )
        os.replace(out.with_suffix(".tmp"), out)

    return Job(
        f"score {arm} seed{seed} {point}",
        [trained],
        lambda: trained.done() and score_path(args, arm, seed, update()).exists(),
        work,
    )


def jobs_of(args):
    trains, scores = [], []
    for seed in args.seeds:
        for arm in args.arms:
            # the first run of each engine makes what its runs share (tokenizer, data): alone
            engine = [t for t in trains if (t.arm in FAIRSEQ_ARMS) == (arm in FAIRSEQ_ARMS)]
            trains.append(train_job(args, arm, seed, engine[:1]))
            scores += [score_job(args, arm, seed, point, trains[-1]) for point in FIRST]
    runs = list(zip(trains, [(s, a) for s in args.seeds for a in args.arms]))
    later = [  # update by update, every run at one update before the next update
        score_job(args, arm, seed, point, train)
        for point in KEEP
        if point != EARLY and point <= args.max_steps
        for train, (seed, arm) in runs
        if arm not in FAIRSEQ_ARMS  # the fairseq runs keep update 200 and the best only
    ]
    # Each run's table points as soon as it is trained, then the trainings, the curve last.
    return scores + trains + later


def run_jobs(jobs, workers):
    """Each job once, ``workers`` at a time, a job only after the jobs it needs."""
    lock, running, failed = threading.Lock(), set(), []

    def next_job():
        with lock:
            for job in jobs:
                if job in running or job.done():
                    continue
                if all(need.done() for need in job.needs):
                    running.add(job)
                    return job
            return None

    def worker():
        while not failed:
            with lock:
                left = [j for j in jobs if j not in running and not j.done()]
            if not left:
                return
            job = next_job()
            if job is None:
                time.sleep(10)
                continue
            say(f"{job.name}: started")
            try:
                job.work()
                say(f"{job.name}: done")
            except Exception as error:  # noqa: BLE001  (reported, the study stops)
                failed.append(f"{job.name}: {error}")
            with lock:
                running.discard(job)

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    if failed:
        raise SystemExit("blimp_study: " + "; ".join(failed))


# --- report ------------------------------------------------------------------------


def read_scores(args, arm, seed, update):
    """The ``all`` row of a score's CSV, as floats; None if not scored."""
    path = score_path(args, arm, seed, update)
    if not path.exists():
        return None
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    seconds = path.with_suffix(".txt").read_text().rsplit("seconds: ", 1)[-1]
    return {
        **{k: float(v) for k, v in rows[-1].items() if k != "phenomenon"},
        "seconds": float(seconds),
        "phenomena": {row["phenomenon"]: row for row in rows[:-1]},
    }


def spread(values, scale=100.0, digits=1):
    """mean ± sample standard deviation over seeds (× scale), and the seeds' range."""
    values = np.asarray(values, dtype=float) * scale
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return (
        f"{values.mean():.{digits}f} ± {values.std(ddof=1):.{digits}f} "
        f"[{values.min():.{digits}f}, {values.max():.{digits}f}]"
    )


def table(args, arms, point):
    lines = [
        "| arm | update | seeds | BLiMP score | lower third | upper third | frequency bias | pairs kept |",
        "|---|---|---|---|---|---|---|---|",
    ]
    found = {}
    for arm in arms:
        seeds, rows, updates = [], [], []
        for seed in args.seeds:
            try:
                update = best_update(args, arm, seed) if point == "best" else point
            except (OSError, KeyError):
                continue
            row = read_scores(args, arm, seed, update)
            if row is not None and (
                point != "best" or (run_folder(args, arm, seed) / "done").exists()
            ):
                seeds.append(seed), rows.append(row), updates.append(update)
        if not rows:
            continue
        found[arm] = dict(zip(seeds, rows))
        pick = lambda key, rows=rows: [row[key] for row in rows]  # noqa: E731
        kept = sorted(set(int(k) for k in pick("kept")))
        lines.append(
            f"| {arm} | {', '.join(map(str, sorted(set(updates))))} | "
            f"{','.join(map(str, seeds))} | {spread(pick('blimp_score'))} | "
            f"{spread(pick('lower_score'))} | {spread(pick('upper_score'))} | "
            f"{spread(pick('frequency_bias'))} | {', '.join(f'{k:,}' for k in kept)} |"
        )
    return lines, found


def paired(found, arm, against="stock"):
    """Per seed both arms have: arm − against, frequency bias and BLiMP score (points)."""
    seeds = sorted(set(found.get(arm, {})) & set(found.get(against, {})))
    if not seeds:
        return None
    diff = {
        key: [100 * (found[arm][s][key] - found[against][s][key]) for s in seeds]
        for key in ("frequency_bias", "blimp_score")
    }
    text = lambda v: (  # noqa: E731
        f"{np.mean(v):+.1f} ± {np.std(v, ddof=1) / math.sqrt(len(v)):.1f}"
        if len(v) > 1
        else f"{v[0]:+.1f}"
    )
    return (
        f"| {arm} − {against} | {','.join(map(str, seeds))} | {text(diff['frequency_bias'])} | "
        f"{text(diff['blimp_score'])} | {', '.join(f'{v:+.1f}' for v in diff['frequency_bias'])} |"
    )


def plot(args, arms, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [a for a in arms if a in ("stock", "natbias")] + [
        a for a in arms if a not in ("stock", "natbias")
    ]
    fig, axes = plt.subplots(1, len(shown), figsize=(4.2 * len(shown), 3.4), sharey=True)
    axes = np.atleast_1d(axes)
    for axis, arm in zip(axes, shown):
        for seed in args.seeds:
            points = [
                (u, r["frequency_bias"] * 100, r["lower_score"] * 100, r["upper_score"] * 100)
                for u in KEEP
                if (r := read_scores(args, arm, seed, u)) is not None
            ]
            if not points:
                continue
            u, bias, lower, upper = map(list, zip(*points))
            axis.plot(u, bias, "o-", label=f"seed {seed}", alpha=0.8)
        axis.axhline(0, color="grey", lw=0.8)
        axis.set_title(arm)
        axis.set_xlabel("update")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("BLiMP frequency bias (points)\nupper third − lower third")
    axes[-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def curve_table(args, arms):
    lines = ["| arm | " + " | ".join(f"{u}" for u in KEEP) + " |", "|---|" + "---|" * len(KEEP)]
    for arm in arms:
        cells = []
        for u in KEEP:
            rows = [r for s in args.seeds if (r := read_scores(args, arm, s, u)) is not None]
            cells.append(
                f"{np.mean([r['frequency_bias'] for r in rows]) * 100:+.1f} (n={len(rows)})"
                if rows
                else ""
            )
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines


def cpu_seconds(args):
    """Per score (its CSV's .tmp path): the CPU seconds of its call, from
    os.wait4 (in its .txt), or for the first calls, made before that, the last
    reading of ``ps -eo pid,etimes,times,args`` every 20 s before the call ended
    (WORKDIR/cpu_times.log: time, pid, elapsed, CPU, the .tmp path, the model)."""
    seen = {}
    log = args.workdir / "cpu_times.log"
    if log.exists():
        for line in log.read_text().splitlines():
            _, _, _, cpu, out, *_ = line.split()
            minutes, _, seconds = cpu.rpartition(":")
            seen[out] = max(seen.get(out, 0), int(minutes or 0) * 60 + int(seconds))
    for path in (args.workdir / "blimp").glob("*/*/*.txt"):
        text = path.read_text()
        if "cpu_seconds: " in text:
            seen[str(path.with_suffix(".tmp"))] = float(text.split("cpu_seconds: ")[1].split()[0])
    # calls that ended with their CSV written, not those stopped part-way
    return {tmp: cpu for tmp, cpu in seen.items() if Path(tmp).with_suffix(".csv").exists()}


def vocabulary_overlap(args):
    """BLiMP's running words (letters and apostrophes, lower-cased) by their
    count in Multi30k's English training text: how much of it the models saw."""
    import gzip
    import re
    from collections import Counter

    words = lambda text: re.findall(r"[a-z']+", text.lower())  # noqa: E731
    with gzip.open(Path(args.multi30k) / f"train.{LANG}.gz", "rt", encoding="utf-8") as f:
        train = Counter(w for line in f for w in words(line))
    blimp = Counter()
    for path in sorted(Path(args.blimp).glob("*.jsonl*")):
        with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8") as f:
            for item in map(json.loads, f):
                blimp.update(words(item["sentence_good"]) + words(item["sentence_bad"]))
    total = sum(blimp.values())
    unseen = sum(c for w, c in blimp.items() if not train[w])
    rare = sum(c for w, c in blimp.items() if 0 < train[w] <= 10)
    return (
        f"{sum(1 for w in blimp if not train[w]):,} of BLiMP's {len(blimp):,} word types never "
        f"occur in Multi30k's English training text; of its {total:,} running words "
        f"{100 * unseen / total:.0f} % are unseen there and {100 * rare / total:.0f} % seen 1 to 10 "
        "times (words: letters and apostrophes, lower-cased)."
    )


def report(args):
    out = Path(args.out)
    arms = [a for a in ARMS if any(run_folder(args, a, s).exists() for s in args.seeds)]
    seconds = [
        r["seconds"]
        for a in arms
        for s in args.seeds
        for u in KEEP
        if (r := read_scores(args, a, s, u)) is not None
    ]
    lines = [
        "# BLiMP frequency bias: stock against the natural bias (transformers and fairseq, "
        "Multi30k English)",
        "",
        f"Written by `research/blimp_study.py`: `python research/blimp_study.py report "
        f"--workdir {args.workdir_given} --out {args.out}` after its `run` (its docstring).",
        "",
        "Set-up: examples/huggingface/language_model.py as research/hf_study.sh's lm-en trains it "
        "(GPT-2, 2 layers, d 128, unigram tokenizer of 8,000 pieces, blocks of 64 tokens, 24 "
        "blocks an update, 1,000 updates, validation every 50, plain cross-entropy; the natural "
        "bias: `add_natural_bias`), one thread, CPU. Each model scored by `natbias-frequency-bias "
        "../shared/data/blimp MODEL --train-text ../shared/data/multi30k/train.en.gz --cpu --csv "
        "...`: all 67 files in one call, the pairs of all ranked together (seed 003, sec. 4.1 "
        "and App. E; the differing tokens are the model's pieces). BLiMP score: all 67,000 pairs, "
        "the mean of the phenomena's, as BLiMP reports it; thirds: of the pairs kept. Points "
        "(× 100); over seeds: mean ± standard deviation [lowest, highest] (the seed spread).",
        "",
        "The fairseq arms: research/study_learning_efficiency.py's lm-en "
        "(`--task lm --lang en`, fairseq-train, `--arch transformer_lm` against "
        "`transformer_lm_natbias` with the gain; 2 layers, d 128, SentencePiece 8,000, blocks of "
        "64, the short schedule, 1,000 updates, validation every 50, `--keep-updates 200`), "
        "scored with `--data data-bin --spm spm.model` (the training split's counts). Their "
        "tokenizer is not the transformers arms': 55,419 pairs kept, not 55,331; each is "
        "paired with its own engine's stock.",
        "",
        *NOT_RUN,
        "",
    ]
    body = []
    for point, title in (
        (EARLY, f"update {EARLY} (the head start)"),
        ("best", "the best checkpoint"),
    ):
        rows, found = table(args, arms, point)
        body += [f"## {title}", "", *rows, ""]
        # Each arm against its engine's stock; the label smoothing against the natural bias
        # alone: what the criterion adds, apart from what the bias gives.
        pairs = [(a, "stock") for a in ARMS if a not in ("stock", *FAIRSEQ_ARMS)]
        pairs += [("fairseq-natbias", "fairseq-stock"), ("natbias+unigram-ls", "natbias")]
        pairs += [("fairseq-natbias+unigram-ls", "fairseq-natbias")]
        diffs = [d for a, b in pairs if (d := paired(found, a, b)) is not None]
        if diffs:
            body += [
                "Paired by seed (points; mean ± standard error of the differences; each seed's):",
                "",
                "| arms | seeds | frequency bias | BLiMP score | per seed (bias) |",
                "|---|---|---|---|---|",
                *diffs,
                "",
            ]
    png = plot(args, arms, out.with_suffix(".png"))
    body += [
        "## The frequency bias over training",
        "",
        "Mean over the seeds scored (n) of the frequency bias, points, at each kept update:",
        "",
        *curve_table(args, arms),
        "",
        f"![frequency bias against updates]({png.name})",
        "",
    ]
    lines += body
    cpu = cpu_seconds(args)
    if seconds:
        lines += [
            f"One natbias-frequency-bias call on all 67 files (134,000 sentences) took "
            f"{min(seconds):.0f} to {max(seconds):.0f} s of wall time here: 2 cores shared with "
            "three other sessions' tests and benchmarks (load 3 to 9), two calls or a call and a "
            "training side by side, one thread, nice 10"
            + (
                f"; the calls watched used {min(cpu.values()):.0f} to {max(cpu.values()):.0f} CPU "
                "seconds (ps every 20 s, the last reading before each call ended)."
                if cpu
                else "."
            ),
            "",
        ]
    third = next(
        (int(r["lower_pairs"]) for a in arms for s in args.seeds for u in KEEP
         if (r := read_scores(args, a, s, u)) is not None),
        None,
    )  # fmt: skip
    if third:
        lines += [
            f"Pairs: a third holds {third:,} pairs, so one third's score carries a sampling error "
            f"of at most {100 * math.sqrt(0.25 / third):.2f} points (sqrt(0.25 / {third:,})) and "
            f"one frequency bias {100 * math.sqrt(0.5 / third):.2f}, from the pairs alone.",
            "",
        ]
    lines += [vocabulary_overlap(args), ""]
    out.write_text("\n".join(lines), encoding="utf-8")
    return out


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=("run", "report"))
    parser.add_argument(
        "--multi30k", default=os.environ.get("NATBIAS_MULTI30K", "../shared/data/multi30k")
    )
    parser.add_argument("--blimp", default=os.environ.get("NATBIAS_BLIMP", "../shared/data/blimp"))
    parser.add_argument("--workdir", default="work/blimp_study")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=["stock", "natbias"])
    parser.add_argument("--max-steps", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=2, help="jobs side by side")
    parser.add_argument("--out", default="research/results/blimp_frequency_bias.md")
    args = parser.parse_args()
    args.workdir_given, args.workdir = args.workdir, Path(args.workdir).resolve()
    if args.action == "run":
        run_jobs(jobs_of(args), args.jobs)
    say(f"report: {report(args)}")


if __name__ == "__main__":
    main()
