"""Running the study: each run's fairseq-train arguments, one run from start
to test score (an interrupted run resumes from its last checkpoint), the plan
of runs side by side, and the run records: what a summary reads of a finished
run, kept beside the results so that seeds trained elsewhere still count."""

import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pipeline
from pipeline import say

from natbias.tools import fairseq_logs

from .arms import EPOCHS_NEVER, REFERENCE_ARM, SCHEDULES


def training_arguments(task, data_bin, run_dir, arm, seed, args):
    training = task.training()
    overrides = {
        "--seed": seed,
        "--max-tokens": args.max_tokens,
        "--validate-interval-updates": args.validate_every,
        "--save-interval-updates": args.validate_every,
        **SCHEDULES[args.schedule],
    }
    if getattr(args, "keep_updates", None):  # fairseq's own pruning would drop them in training
        overrides["--keep-interval-updates"] = -1
    if getattr(args, "train_pairs", None):
        # A small corpus's epoch is a few dozen updates: validate and save on
        # the update grid alone, not also at every epoch's end (fairseq's rule).
        overrides.update({"--validate-interval": EPOCHS_NEVER, "--save-interval": EPOCHS_NEVER})
    for option, value in overrides.items():
        if option in training:
            training[training.index(option) + 1] = str(value)
        else:
            training += [option, str(value)]
    return pipeline.train_command(
        data_bin,
        run_dir,
        [*arm.model_arguments(task), *task.options, *training, *arm.criterion_arguments()],
        args.max_update,
    )


def train_and_score(task, data_bin, work, run_dir, arm, seed, args):
    """One run, start to test score; each step skipped when its output exists."""
    name = f"{task.folder} {args.setting} {arm.name} seed{seed}"
    if not (run_dir / "done").exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        arguments = training_arguments(task, data_bin, run_dir, arm, seed, args)
        # Update 0 first, so that the time said is training's alone
        # (pipeline.train finds it recorded).
        pipeline.record_step0(arguments, run_dir / "step0.json")
        started = time.time()
        say(f"{name}: training, {args.max_update} updates")

        def progress(record):
            bleu = record.values.get("bleu")
            say(
                f"{name}: update {record.num_updates}/{args.max_update} valid NLL "
                f"{record.values[task.loss_key]:.3f}"
                + (f" BLEU {bleu:.2f}" if bleu is not None else "")
            )

        pipeline.train(arguments, run_dir, pipeline.on_validation(task.loss_key, progress))
        say(f"{name}: trained in {time.time() - started:.0f} s")
    task.evaluate(data_bin, work, run_dir, name)
    kept = [f"_{update}.pt" for update in getattr(args, "keep_updates", None) or ()]
    for checkpoint in run_dir.glob("checkpoint_*_*.pt"):  # interval checkpoints
        if not any(checkpoint.name.endswith(suffix) for suffix in kept):
            checkpoint.unlink()


def finished(task, run_dir):
    return (run_dir / "done").exists() and task.finished(run_dir)


def train_all(task, data_bin, work, study_dir, arms, seeds, args):
    """Every run of the plan (each arm x seed), ``args.jobs`` side by side;
    finished runs are skipped (:func:`train_and_score`)."""
    # Seed by seed, the reference arm first in each: a study cut short
    # still compares the arms (the others' "updates to reach" need stock).
    plan = sorted(
        ((arm, seed) for seed in seeds for arm in arms),
        key=lambda job: (job[1], job[0].name != REFERENCE_ARM),
    )

    def run(job):
        arm, seed = job
        run_dir = study_dir / arm.folder / f"seed{seed}"
        train_and_score(task, data_bin, work, run_dir, arm, seed, args)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(run, plan))  # a run's failure raised here


# --- run records: what a summary reads of a finished run --------------------


def run_record(task, run_dir, with_bleu_curve=False):
    """Everything a summary reads of one finished run, as a few kilobytes of
    JSON: the validation NLL curve (update 0 included), the validation BLEU
    curve where the study logs one, the test scores, update 0's figures and
    the gain at the end. Kept beside the results (see :func:`collect_runs`)
    so that a study can add seeds on a machine that no longer has the
    earlier runs' logs: a machine lost its /tmp mid-study once (issue 19)."""
    by_update = pipeline.validation_curve(run_dir, task.loss_key)  # update 0 included
    log = fairseq_logs.read_log(str(run_dir / "train.log"))
    _, gains = fairseq_logs.series(log, fairseq_logs.VALID, "gain")
    record = {
        "updates": [float(u) for u in sorted(by_update)],
        "nll": [float(by_update[u]) for u in sorted(by_update)],
        "scores": task.test_scores(run_dir),
        "step0": json.loads((run_dir / "step0.json").read_text()),
        "gain": float(gains[-1]) if len(gains) else None,
    }
    if with_bleu_curve:
        bleu_updates, bleu = fairseq_logs.series(log, fairseq_logs.VALID, "bleu")
        record.update(bleu_updates=bleu_updates.tolist(), bleu=bleu.tolist())
    return record


def nll_curve(record):
    return np.asarray(record["updates"], dtype=np.float64), np.asarray(record["nll"])


def bleu_curve(record):
    return np.asarray(record["bleu_updates"], dtype=np.float64), np.asarray(record["bleu"])


def collect_runs(task, study_dir, arms, seeds, archive=None, with_bleu_curve=False):
    """``{arm: [record, ...]}`` of the finished runs, seed order, arms
    without one left out. A finished run in ``study_dir`` gives its record
    from its logs, and writes it to ``archive``/<arm>/seed<N>.json when an
    archive folder is given; a run absent from ``study_dir`` is read back
    from the archive. The study's archive is <--results>/runs/<folder>_<setting>."""
    runs = {}
    for arm in arms:
        records = []
        for seed in seeds:
            run_dir = study_dir / arm.folder / f"seed{seed}"
            kept = archive / arm.folder / f"seed{seed}.json" if archive else None
            if finished(task, run_dir):
                record = run_record(task, run_dir, with_bleu_curve)
                if kept:
                    kept.parent.mkdir(parents=True, exist_ok=True)
                    kept.write_text(json.dumps(record, indent=1) + "\n")
            elif kept and kept.exists():
                record = json.loads(kept.read_text())
            else:
                continue
            # The seed travels with the record in memory (not in the file: the
            # file's name holds it), so that differences can pair arms by seed.
            records.append({**record, "seed": seed})
        if records:
            runs[arm] = records
    return runs
