"""The paper's learning-efficiency claim, measured on real data against stock
fairseq (issues 6, 10 and 11), for translation and for language models.

Translation (--task translation): Multi30k (joint SentencePiece 8k; --pair
de-en or fr-en), a small transformer (2+2 layers, d = 128, tied embeddings).
Language modelling (--task lm): one side of Multi30k (--lang en, de or fr;
SentencePiece 8k), a small transformer LM (2 layers, d = 128, tied, blocks of
64 tokens). Each trained on the CPU through the real fairseq-train, for each
arm x seed under a learning-rate schedule:

arms
    ``stock``                   fairseq's own ``--arch transformer`` (or
                                ``transformer_lm``): what a user would
                                otherwise run; no bias
    ``WINIT/BIAS``              ``--arch transformer_natbias`` (or
                                ``transformer_lm_natbias``) with
                                ``--natbias-weight-init WINIT --natbias-init BIAS``,
                                e.g. ``gain/unigram``, ``fairseq/zero``
    ``gain@G0,C/BIAS``          the ``gain`` init with ``--natbias-gain-init G0
                                --natbias-gain-speed C`` (for screening)
    ``gain@G0,C,FORM/BIAS``     ... and ``--natbias-gain-form FORM`` (capped,
                                exp or linear)
    ``gain@G0,C,FORM,SCHED/BIAS`` ... and ``--natbias-gain-schedule SCHED`` (lr or peak)
schedules (``--schedule``)
    ``short``  lr 1e-3, inverse-sqrt warm-up 100 updates (the demo's)
    ``paper``  lr 5e-4, inverse-sqrt warm-up 4,000 updates from 1e-7 (the
               paper's sec. 4.1 schedule, as in the recipes)

--untied drops the embedding sharing (an untied output projection); its runs
and results are named ``<schedule>-untied``.

--preset iwslt trains the paper's IWSLT size instead of the small model
(translation): ``transformer_natbias_iwslt_de_en`` (sec. 4.1: 6+6 layers, 4
heads, FFN 256; d = 256, the package's choice) against stock fairseq's
``transformer`` at the same sizes (fairseq's own transformer_iwslt_de_en is
another network: d 512, FFN 1024), tied; runs and results are named
``<schedule>-iwslt``. With ``--schedule paper --max-tokens 4096`` it is the
paper's set-up.

--converge trains each run to convergence instead of for a fixed 1,000
updates: validation every 250 updates (and at each epoch's end, fairseq's
rule), the best checkpoint by validation NLL, and fairseq's ``--patience``
(default 6 validations without a lower NLL) stops the run, capped at 12,000
updates; no BLEU during training (it would cost more than the training
between validations); the best checkpoint scored on test_2016_flickr and
test_2017_flickr. "Updates to reach" then aims at stock's best validation
NLL, and its ratio is to stock's update of that best. Runs and results are
named ``<schedule>-converge``. ``--patience 0`` trains every arm for the same
budget, --max-update, instead: the fair comparison, since patience 6 stopped
stock while it was still improving (benchmarks/README.md, section 1.10); a run
an earlier patience or a lower cap stopped trains on to the new budget.

Measured per run, validating every --validate-every updates:

* validation NLL at update 0 (natbias-step0) and over updates, with the
  unigram cross-entropy of the validation targets for reference;
* translation: validation BLEU over updates (fairseq's own --eval-bleu:
  greedy, sacreBLEU 13a on detokenised SentencePiece, the whole validation
  set);
* ALC of the validation NLL (update 0 included) and, for translation, of the
  validation BLEU (from the first validation; the paper's Fig. 3 measure):
  trapezoidal rule divided by the span of updates (natbias-alc's);
* updates needed to reach the reference arm's (``stock``) validation NLL at
  its last update (mean over its seeds; interpolated; "never" if not reached);
* translation: test BLEU/chrF (sacreBLEU, with signatures) of the best
  checkpoint (highest validation BLEU: the paper's early stopping), beam 5;
  language model: test NLL and perplexity from fairseq-eval-lm of the best
  checkpoint (lowest validation loss);
* the gain g at the end, for the ``gain`` init.

Means and standard errors over seeds go to a Markdown table and plots in
--workdir/<pair or lm-lang>/<schedule>/; the runs to .../<schedule>/<arm>/seed<k>/.
Finished runs are skipped and an interrupted one resumes from its last
checkpoint, so the study runs in parts and extends run by run. --jobs runs
that many trainings side by side on --threads CPU threads each (on the 2-core
machine two 1-thread runs beat one 2-thread run after the other). With
--results DIR, each finished run's record (its curves and scores, a few kB of
JSON) is also kept in DIR/runs/<pair or lm-lang>_<schedule>/<arm>/seed<k>.json,
and a run whose folder is gone is summarised from there: seeds trained on
another machine, or before a lost /tmp, still count.

    .venv/bin/python benchmarks/study_learning_efficiency.py --pair de-en \\
        --schedule short --seeds 1 2 3 \\
        --arms stock gain/unigram gain/zero gain/none fairseq/unigram fairseq/zero fairseq/none
    .venv/bin/python benchmarks/study_learning_efficiency.py --task lm --lang en \\
        --seeds 1 2 3 --arms stock gain/unigram gain/zero fairseq/unigram
    .venv/bin/python benchmarks/study_learning_efficiency.py --pair fr-en --converge \\
        --patience 0 --max-update 20000 --seeds 1 2 3 --arms stock gain/unigram gain/zero
"""

import argparse
import gzip
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fairseq_natbias import pipeline  # noqa: E402
from fairseq_natbias.analysis import alc, fairseq_logs, plots  # noqa: E402
from fairseq_natbias.analysis.stats import mean_stderr  # noqa: E402
from fairseq_natbias.data_fetch import (  # noqa: E402
    SPLIT_FILES, has_all_files, raw_file, read_lines)
from fairseq_natbias.pipeline import say  # noqa: E402

SCHEDULES = {
    "short": {"--lr": "1e-3", "--warmup-updates": "100"},
    "paper": {"--lr": "5e-4", "--warmup-updates": "4000", "--warmup-init-lr": "1e-7"},
}
REFERENCE_ARM = "stock"
# Greedy and length-capped: an untrained model's validation translations
# would otherwise run to fairseq's default limit of 200 tokens. The best
# checkpoint is the one with the best validation BLEU, as in the paper's
# early stopping (sec. 4.1).
EVAL_BLEU = ["--eval-bleu", "--eval-bleu-args", '{"beam": 1, "max_len_a": 1.2, "max_len_b": 10}',
             "--eval-bleu-remove-bpe", "sentencepiece",
             "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric"]


# --preset: this package's architecture at one of the paper's sizes, and
# those sizes spelt out, for stock fairseq's ``transformer`` to match
# (tests/test_study_learning_efficiency.py checks they are the preset's).
PRESETS = {"iwslt": ("transformer_natbias_iwslt_de_en", (
    "--encoder-layers 6 --decoder-layers 6 --encoder-embed-dim 256 --decoder-embed-dim 256 "
    "--encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256 "
    "--encoder-attention-heads 4 --decoder-attention-heads 4").split())}
TYING_OPTIONS = ("--share-all-embeddings", "--share-decoder-input-output-embed")
# --converge scores the best checkpoint on both Multi30k test sets (the first
# is the data-bin's own test split).
CONVERGE_TEST_SETS = ("test_2016_flickr", "test_2017_flickr")


# --train-pairs: the SentencePiece vocabulary for a corpus of N training pairs.
# 8,000 pieces at Multi30k's 29,000 pairs (every earlier study), scaled with
# the square root of N (Heaps' law: types grow about as sqrt(tokens)) and
# rounded to 500: 2,500 at 3,000 pairs, 4,500 at 10,000.
FULL_PAIRS, FULL_VOCABULARY = 29000, 8000
EPOCHS_NEVER = 1000000


def vocabulary_for(pairs):
    """Joint SentencePiece vocabulary for ``pairs`` training pairs (see above)."""
    scaled = FULL_VOCABULARY * math.sqrt(min(pairs, FULL_PAIRS) / FULL_PAIRS)
    return int(max(500, 500 * round(scaled / 500)))


def first_pairs(raw, folder, langs, pairs):
    """A raw-text folder whose training text is the first ``pairs`` lines of
    ``raw``'s (each language alike, so they stay aligned) and whose other
    splits link to ``raw``'s; made once, reused."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in [*SPLIT_FILES.values(), *CONVERGE_TEST_SETS[1:]]:
        for lang in langs:
            source = raw_file(raw, name, lang)
            if source is None:
                continue
            target = folder / source.name
            if name == SPLIT_FILES["train"]:
                lines = read_lines(source)
                if len(lines) < pairs:
                    raise SystemExit(f"study: --train-pairs {pairs}: {source} has only "
                                     f"{len(lines)} lines")
                if not target.exists():
                    with gzip.open(target, "wt", encoding="utf-8") as out:
                        out.write("\n".join(lines[:pairs]) + "\n")
            elif not target.exists():
                target.symlink_to(source.resolve())
    return folder


def converge_options(options, loss_key):
    """The task's options for a --converge run: no BLEU during training (at
    every validation it would cost more than the training between them), the
    best checkpoint by validation NLL, which --patience watches."""
    kept, skip = [], 0
    for option in options:
        if skip:
            skip -= 1
        elif option in EVAL_BLEU and option.startswith("--"):
            skip = 0 if option in ("--eval-bleu", "--maximize-best-checkpoint-metric") else 1
        else:
            kept.append(option)
    return [*kept, "--best-checkpoint-metric", loss_key]


class Translation:
    """Multi30k SRC->TGT with transformer(_natbias)."""

    name = "translation"
    stock_arch, natbias_arch = "transformer", "transformer_natbias"
    loss_key = "nll_loss"  # label_smoothed_cross_entropy's NLL, bits
    options = [*pipeline.MODEL, *EVAL_BLEU]

    def __init__(self, pair, extra_test_sets=()):
        self.langs = tuple(pair.split("-"))
        self.folder = pair
        self.extra_test_sets = tuple(extra_test_sets)
        self.vocab_size = FULL_VOCABULARY

    def use_preset(self, preset):
        """The paper-size preset for the natbias arms, its sizes for stock's
        ``transformer``; tied as before."""
        self.natbias_arch, sizes = PRESETS[preset]
        self.options = [*sizes, "--share-all-embeddings", *EVAL_BLEU]

    def prepare(self, raw, work):
        data_bin = pipeline.prepare(raw, work, vocab_size=self.vocab_size, langs=self.langs)
        for test_set in self.extra_test_sets:
            pipeline.prepare_test_set(raw, work, data_bin, self.langs, test_set)
        return data_bin

    def training(self):
        return list(pipeline.TRAINING)

    def evaluate(self, data_bin, work, run_dir, name):
        pipeline.evaluate(data_bin, work, run_dir, name, target=self.langs[1])
        for test_set in self.extra_test_sets:
            pipeline.evaluate(data_bin, work, run_dir, name, target=self.langs[1],
                              test_set=test_set)

    def test_scores(self, run_dir):
        scores = json.loads((run_dir / "test_scores.json").read_text())
        for test_set in self.extra_test_sets:
            extra = json.loads((run_dir / f"{test_set}_scores.json").read_text())
            scores.update({f"{key}_{test_set}": value for key, value in extra.items()})
        return scores

    def finished(self, run_dir):
        return all((run_dir / name).exists() for name in
                   ["test_scores.json", *(f"{t}_scores.json" for t in self.extra_test_sets)])


class LanguageModel:
    """One language of Multi30k with transformer_lm(_natbias)."""

    name = "lm"
    stock_arch, natbias_arch = "transformer_lm", "transformer_lm_natbias"
    loss_key = "loss"  # cross_entropy's loss, bits
    # Input/output dims and pre-norm spelt out: fairseq 0.12 builds stock
    # ``--arch transformer_lm`` from its dataclass defaults (512-dim input and
    # output embeddings, post-norm) whatever --decoder-embed-dim says, while
    # transformer_lm_natbias applies base_lm_architecture as fairseq meant
    # (dims follow the embedding, pre-norm). Explicit, both build one network.
    options = ["--decoder-layers", "2", "--decoder-embed-dim", "128",
               "--decoder-input-dim", "128", "--decoder-output-dim", "128",
               "--decoder-normalize-before",
               "--decoder-ffn-embed-dim", "256", "--decoder-attention-heads", "4",
               "--share-decoder-input-output-embed"]

    def __init__(self, lang):
        self.lang = lang
        self.folder = f"lm-{lang}"

    def prepare(self, raw, work):
        return pipeline.prepare_lm(raw, work, vocab_size=8000, lang=self.lang)

    def training(self):
        training = list(pipeline.TRAINING)
        for option in ("--criterion", "--label-smoothing"):
            index = training.index(option)
            del training[index:index + 2]
        return [*training, "--task", "language_modeling", "--tokens-per-sample", "64",
                "--sample-break-mode", "none", "--criterion", "cross_entropy"]

    def evaluate(self, data_bin, work, run_dir, name):
        """Test NLL (bits) and perplexity of the best checkpoint, fairseq-eval-lm."""
        scores_path = run_dir / "test_scores.json"
        if scores_path.exists():
            return
        say(f"eval-lm [{name}]: test split")
        output = pipeline.run([*pipeline.tool("fairseq-eval-lm"), str(data_bin), "--user-dir",
                               "fairseq_natbias", "--path", str(run_dir / "checkpoint_best.pt"),
                               "--gen-subset", "test", "--cpu", "--max-tokens", "4096",
                               "--tokens-per-sample", "64", "--num-workers", "0"])
        match = re.search(r"Loss \(base 2\): ([\d.]+), Perplexity: ([\d.]+)", output)
        if not match:
            raise SystemExit(f"study: no loss in fairseq-eval-lm's output:\n{output[-2000:]}")
        scores_path.write_text(json.dumps({"nll": float(match[1]), "ppl": float(match[2])}))

    def test_scores(self, run_dir):
        return json.loads((run_dir / "test_scores.json").read_text())

    def finished(self, run_dir):
        return (run_dir / "test_scores.json").exists()


@dataclass(frozen=True)
class Arm:
    """One configuration of the comparison (see the module docstring)."""

    name: str
    weight_init: Optional[str] = None
    bias: Optional[str] = None
    gain_init: Optional[str] = None
    gain_speed: Optional[str] = None
    gain_form: Optional[str] = None
    gain_schedule: Optional[str] = None

    @classmethod
    def parse(cls, text):
        if text == REFERENCE_ARM:
            return cls(text)
        match = re.fullmatch(
            r"(\w+)(?:@([\d.e-]+),([\d.e-]+)(?:,(capped|exp|linear)(?:,(lr|peak))?)?)?"
            r"/(unigram|zero|none)", text)
        if not match:
            raise SystemExit(f"study: bad arm {text!r}: give stock, WINIT/BIAS, "
                             "gain@G0,C/BIAS, gain@G0,C,FORM/BIAS or gain@G0,C,FORM,SCHED/BIAS")
        weight_init, gain_init, gain_speed, gain_form, gain_schedule, bias = match.groups()
        return cls(text, weight_init, bias, gain_init, gain_speed, gain_form, gain_schedule)

    @property
    def folder(self):
        return self.name.replace("/", "-").replace("@", "_").replace(",", "_")

    def model_arguments(self, task):
        if self.name == REFERENCE_ARM:
            return ["--arch", task.stock_arch]
        options = ["--arch", task.natbias_arch, "--natbias-init", self.bias,
                   "--natbias-weight-init", self.weight_init]
        if self.gain_init:
            options += ["--natbias-gain-init", self.gain_init,
                        "--natbias-gain-speed", self.gain_speed]
        if self.gain_form:
            options += ["--natbias-gain-form", self.gain_form]
        if self.gain_schedule:
            options += ["--natbias-gain-schedule", self.gain_schedule]
        return options


def training_arguments(task, data_bin, run_dir, arm, seed, args):
    training = task.training()
    overrides = {"--seed": seed, "--max-tokens": args.max_tokens,
                 "--validate-interval-updates": args.validate_every,
                 "--save-interval-updates": args.validate_every,
                 **SCHEDULES[args.schedule]}
    if getattr(args, "train_pairs", None):
        # A small corpus's epoch is a few dozen updates: validate and save on
        # the update grid alone, not also at every epoch's end (fairseq's rule).
        overrides.update({"--validate-interval": EPOCHS_NEVER, "--save-interval": EPOCHS_NEVER})
    for option, value in overrides.items():
        if option in training:
            training[training.index(option) + 1] = str(value)
        else:
            training += [option, str(value)]
    return pipeline.train_command(data_bin, run_dir,
                                  [*arm.model_arguments(task), *task.options, *training],
                                  args.max_update)


# fairseq-train's line when --patience stops a run (fairseq_cli/train.py).
EARLY_STOP = "early stop since valid performance hasn't improved"


def reopen_to_train_on(run_dir, max_update, patience, name):
    """A finished --converge run trains on to a higher ``max_update`` when
    its cap stopped it, or when its patience stopped it and ``patience`` is
    now 0 (a fixed budget: fairseq then stops at the cap alone). Its scores
    move to run_dir/stopped<N>/ (kept, not lost) and fairseq resumes it from
    checkpoint_last.pt. True when reopened. fairseq's patience count starts
    again on resume, so a run reopened under a patience may train up to that
    many validations longer than one run straight to its stop."""
    log = run_dir / "train.log"
    if not (run_dir / "done").exists() or not log.exists():
        return False
    text = log.read_text(encoding="utf-8", errors="replace")
    stopped_early = EARLY_STOP in text
    if stopped_early and patience > 0:
        return False
    updates = [r.num_updates for r in fairseq_logs.parse_lines(text.splitlines())
               if r.num_updates is not None]
    last = max(updates, default=0)
    if last >= max_update:
        return False
    kept = run_dir / f"stopped{last}"
    kept.mkdir(exist_ok=True)
    for path in [run_dir / "done", *run_dir.glob("*scores.json"), *run_dir.glob("*.hyp")]:
        path.replace(kept / path.name)
    why = "its patience (now 0: a fixed budget)" if stopped_early else "its cap"
    say(f"{name}: stopped by {why} at update {last}: training on to {max_update} (its "
        f"scores at {last} kept in {kept})")
    return True


def train_and_score(task, data_bin, work, run_dir, arm, seed, args):
    """One run, start to test score; each step skipped when its output exists."""
    name = f"{task.folder} {args.setting} {arm.name} seed{seed}"
    if args.converge:
        reopen_to_train_on(run_dir, args.max_update, args.patience, name)
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
            say(f"{name}: update {record.num_updates}/{args.max_update} valid NLL "
                f"{record.values[task.loss_key]:.3f}"
                + (f" BLEU {bleu:.2f}" if bleu is not None else ""))

        pipeline.train(arguments, run_dir, pipeline.on_validation(task.loss_key, progress))
        say(f"{name}: trained in {time.time() - started:.0f} s")
    task.evaluate(data_bin, work, run_dir, name)
    for checkpoint in run_dir.glob("checkpoint_*_*.pt"):  # interval checkpoints
        checkpoint.unlink()


def curve(run_dir, key="nll_loss", loss_key="nll_loss"):
    """Validation curve of key; the NLL (``loss_key``) starts at update 0 (the
    demo's curve)."""
    if key == loss_key:
        by_update = pipeline.validation_curve(run_dir, loss_key)
        updates = sorted(by_update)
        return np.array(updates, dtype=np.float64), np.array([by_update[u] for u in updates])
    records = fairseq_logs.read_log(str(run_dir / "train.log"))
    return fairseq_logs.series(records, fairseq_logs.VALID, key)


def updates_to_reach(updates, values, target):
    """First update at which the (interpolated) curve is at or below target."""
    for i in range(len(values)):
        if values[i] <= target:
            if i == 0:
                return 0.0
            u0, u1, v0, v1 = updates[i - 1], updates[i], values[i - 1], values[i]
            return float(u0 + (u1 - u0) * (v0 - target) / (v0 - v1))
    return float("inf")


def last_gain(run_dir):
    records = fairseq_logs.read_log(str(run_dir / "train.log"))
    _, gains = fairseq_logs.series(records, fairseq_logs.VALID, "gain")
    return float(gains[-1]) if len(gains) else None


def finished(task, run_dir):
    return (run_dir / "done").exists() and task.finished(run_dir)


# --- run records: what a summary reads of a finished run --------------------


def run_record(task, run_dir, with_bleu_curve=False):
    """Everything a summary reads of one finished run, as a few kilobytes of
    JSON: the validation NLL curve (update 0 included), the validation BLEU
    curve where the study logs one, the test scores, update 0's figures and
    the gain at the end. Kept beside the results (see :func:`collect_runs`)
    so that a study can add seeds on a machine that no longer has the
    earlier runs' logs: a machine lost its /tmp mid-study once (issue 19)."""
    loss = task.loss_key
    updates, nll = curve(run_dir, loss, loss)
    record = {"updates": updates.tolist(), "nll": nll.tolist(),
              "scores": task.test_scores(run_dir),
              "step0": json.loads((run_dir / "step0.json").read_text()),
              "gain": last_gain(run_dir)}
    if with_bleu_curve:
        bleu_updates, bleu = curve(run_dir, "bleu", loss)
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
            records.append(record)
        if records:
            runs[arm] = records
    return runs


def time_updates(task, data_bin, arms, args):
    """Seconds per update of each arm (``--time-updates N``): N updates
    through fairseq-train, no validation, no checkpoint, in a temporary
    folder; the rate is fairseq's own (``ups`` of the last train_inner line,
    logged every N/4 updates), its ratio against stock beside it. To plan a
    study's time before starting it."""
    rates = {}
    for arm in arms:
        with tempfile.TemporaryDirectory() as run_dir:
            arguments = timing_arguments(task, data_bin, Path(run_dir), arm, args)
            output = pipeline.run([*pipeline.tool("fairseq-train"), *arguments])
        inner = [r for r in fairseq_logs.parse_lines(output.splitlines())
                 if r.tag == fairseq_logs.TRAIN_INNER and "ups" in r.values]
        if not inner:
            raise SystemExit(f"study: no train_inner line in fairseq-train's output:\n"
                             f"{output[-2000:]}")
        rates[arm.name] = float(inner[-1].values["ups"])
    stock = rates.get(REFERENCE_ARM)
    for name, ups in rates.items():
        ratio = f", {stock / ups:.3f}x stock's time" if stock and name != REFERENCE_ARM else ""
        print(f"{name}: {ups:.3f} updates/s, {1 / ups:.2f} s per update{ratio}")
    return rates


def timing_arguments(task, data_bin, run_dir, arm, args):
    """A run's fairseq-train arguments for --time-updates: --time-updates
    updates, logged four times, no validation and no checkpoint."""
    timing = argparse.Namespace(**{**vars(args), "max_update": args.time_updates})
    arguments = training_arguments(task, data_bin, run_dir, arm, 1, timing)
    interval = arguments.index("--log-interval") + 1
    arguments[interval] = str(max(1, args.time_updates // 4))
    return [*arguments, "--disable-validation", "--no-save"]


# --converge's NLL plot has a second panel from this update on.
ZOOM_FROM = 2000


def from_update(line, first):
    """A plotted line (see :func:`summarise`) from update ``first`` on."""
    keep = np.asarray(line["x"]) >= first
    return {key: (np.asarray(value)[keep] if key != "label" else value)
            for key, value in line.items()}


def band_of(values):
    """Standard error over seeds (rows) of each column; 0 for one seed."""
    if len(values) < 2:
        return np.zeros(values.shape[1])
    return values.std(0, ddof=1) / np.sqrt(len(values))


def band(curves):
    """Mean ± standard error over seeds on the first run's grid."""
    grid = curves[0][0]
    stacked = np.array([np.interp(grid, u, v) for u, v in curves])
    return grid, stacked.mean(0), band_of(stacked)


def summarise(task, runs, converge=False):
    """Rows of the table and the curves of the plots, over the records of
    finished runs (``{arm: [record, ...]}``, :func:`collect_runs`). The
    target of "updates to reach" is stock's validation NLL at its last
    update, or, with ``converge``, at its best."""
    reference = next((records for arm, records in runs.items()
                      if arm.name == REFERENCE_ARM), None)
    pick = np.min if converge else (lambda values: values[-1])
    target = (float(np.mean([pick(nll_curve(r)[1]) for r in reference]))
              if reference else None)
    with_bleu_curves = task.name == "translation" and not converge
    rows, nll_lines, bleu_lines = [], [], []
    for arm, records in runs.items():
        nll = [nll_curve(r) for r in records]
        bleu = [bleu_curve(r) for r in records] if with_bleu_curves else []
        scores = [r["scores"] for r in records]
        step0 = [r["step0"] for r in records]
        gains = [r["gain"] for r in records if r["gain"] is not None]
        row = {
            "arm": arm.name, "n": len(records),
            "step0": mean_stderr([v[0] for _, v in nll]),
            "unigram_ce": (mean_stderr([s["unigram_ce"] for s in step0])
                           if all("unigram_ce" in s for s in step0) else None),
            "alc": mean_stderr([alc.area_under_learning_curve(u, v).alc for u, v in nll]),
            "reach": ([updates_to_reach(u, v, target) for u, v in nll]
                      if target is not None else []),
            "final_update": int(nll[0][0][-1]),
            "final_nll": mean_stderr([v[-1] for _, v in nll]),
            "gain": mean_stderr(gains) if gains else None,
        }
        if converge:
            row.update({
                "best_nll": mean_stderr([float(np.min(v)) for _, v in nll]),
                "best_update": [int(u[np.argmin(v)]) for u, v in nll],
                "last_update": [int(u[-1]) for u, _ in nll],
            })
        if task.name == "translation":
            row.update({
                "bleu": mean_stderr([s["bleu"] for s in scores]),
                "chrf": mean_stderr([s["chrf"] for s in scores]),
                "signatures": (scores[0]["bleu_signature"], scores[0]["chrf_signature"]),
            })
            for test_set in task.extra_test_sets:
                row.update({f"{key}_{test_set}": mean_stderr([s[f"{key}_{test_set}"]
                                                               for s in scores])
                            for key in ("bleu", "chrf")})
        else:
            row.update({"test_nll": mean_stderr([s["nll"] for s in scores]),
                        "test_ppl": mean_stderr([s["ppl"] for s in scores])})
        if with_bleu_curves:
            row.update({
                "alc_bleu": mean_stderr([alc.area_under_learning_curve(u, v).alc
                                         for u, v in bleu]),
                "final_bleu": mean_stderr([v[-1] for _, v in bleu]),
            })
        rows.append(row)
        for lines, curves in ((nll_lines, nll), (bleu_lines, bleu)):
            if not curves:
                continue
            grid, mean, se = band(curves)
            lines.append({"label": arm.name, "x": grid, "mean": mean,
                          "low": mean - se, "high": mean + se})
    return rows, target, nll_lines, bleu_lines


def markdown(rows, target, title):
    reach_head = (f"updates to reach stock's valid NLL at its last update "
                  f"({target:.3f}), per seed" if target is not None else "updates to reach stock")
    translation = bool(rows) and "bleu" in rows[0]
    columns = ["arm", "n", "valid NLL at update 0", "ALC of valid NLL"]
    columns += ["ALC of valid BLEU (greedy)"] if translation else []
    columns += [reach_head, "valid NLL at the end"]
    columns += (["valid BLEU at the end (greedy)", "test BLEU", "test chrF"] if translation
                else ["test NLL (eval-lm)", "test perplexity"])
    columns += ["gain g at the end"]
    out = [f"### {title}", "", "| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    for row in rows:
        reach = ", ".join("never" if r == float("inf") else f"{r:.0f}" for r in row["reach"])
        cells = [row["arm"], str(row["n"]), row["step0"].format(3), row["alc"].format(3)]
        cells += [row["alc_bleu"].format(2)] if translation else []
        cells += [reach, row["final_nll"].format(3)]
        cells += ([row["final_bleu"].format(2), row["bleu"].format(2), row["chrf"].format(2)]
                  if translation else [row["test_nll"].format(3), row["test_ppl"].format(2)])
        cells += [row["gain"].format(2) if row["gain"] else ""]
        out.append("| " + " | ".join(cells) + " |")
    ce = [row["unigram_ce"] for row in rows if row["unigram_ce"]]
    if ce:
        out += ["", f"Unigram cross-entropy of the validation targets: {ce[0].mean:.3f} bits."]
    if rows:
        out += [f"Updates per run: {rows[0]['final_update']}. Mean ± standard error over seeds."]
    if translation:
        out += [f"test BLEU signature: `{rows[0]['signatures'][0]}`; "
                f"chrF: `{rows[0]['signatures'][1]}`"]
    return "\n".join(out + comparisons(rows)) + "\n"


HORIZONS = (1000, 2000, 4000, 6000, 8000, 10000, 12000, 16000, 20000, 30000)


def reach_by_horizon(runs):
    """For each arm but stock and each horizon h (within every stock run):
    the updates it needs to reach stock's mean validation NLL at update h,
    as a fraction of h, one value per seed; ``{arm name: (horizons,
    ratios[seed][horizon])}``. Shows whether the head start lasts. ``runs``
    as for :func:`summarise`."""
    stock = [nll_curve(r) for arm, records in runs.items()
             if arm.name == REFERENCE_ARM for r in records]
    if not stock:
        return {}
    horizons = [h for h in HORIZONS if h <= min(u[-1] for u, _ in stock)]
    targets = [float(np.mean([np.interp(h, u, v) for u, v in stock])) for h in horizons]
    found = {}
    for arm, records in runs.items():
        if arm.name == REFERENCE_ARM:
            continue
        curves = [nll_curve(r) for r in records]
        ratios = [[updates_to_reach(updates, values, target) / h
                   for h, target in zip(horizons, targets)] for updates, values in curves]
        found[arm.name] = (horizons, np.array(ratios))
    return found


def markdown_reach_by_horizon(found):
    if not found:
        return ""
    horizons = next(iter(found.values()))[0]
    out = ["", "Updates to reach stock's validation NLL at update h, as a fraction of h "
           "(mean over seeds; 1 = no head start):", "",
           "| arm | " + " | ".join(f"h = {h}" for h in horizons) + " |",
           "|---" * (len(horizons) + 1) + "|"]
    for name, (_, ratios) in found.items():
        out.append(f"| {name} | " + " | ".join(horizon_cell(column) for column in ratios.T)
                   + " |")
    return "\n".join(out) + "\n"


def reach_line(name, horizons, ratios):
    """One arm's reach-by-horizon curve, mean ± s.e. over seeds, drawn only
    at the horizons every seed reached (the table shows the others)."""
    reached = np.isfinite(ratios).all(0)
    ratios = ratios[:, reached]
    mean, error = ratios.mean(0), band_of(ratios)
    return {"label": name, "x": [h for h, ok in zip(horizons, reached) if ok],
            "mean": mean, "low": mean - error, "high": mean + error}


def horizon_cell(ratios):
    """Mean ± s.e. over seeds; where a seed never reached stock (inf), the
    seeds one by one instead, since a mean with inf in it says nothing."""
    if np.isfinite(ratios).all():
        return mean_stderr(list(ratios)).format(2, count=False)
    return ", ".join("never" if np.isinf(r) else f"{r:.2f}" for r in ratios)


def markdown_converged(rows, target, title, test_sets, patience=6):
    """The table of a --converge study: best validation NLL, when each run got
    there and stopped, and test scores of the best checkpoint on each test set."""
    reach_head = (f"updates to reach stock's best valid NLL ({target:.3f}), per seed"
                  if target is not None else "updates to reach stock's best")
    translation = bool(rows) and "bleu" in rows[0]
    columns = ["arm", "n", "valid NLL at update 0", reach_head, "best valid NLL",
               "update of the best, per seed", "last update (stopped), per seed"]
    columns += ([f"{name} {metric}" for name in test_sets for metric in ("BLEU", "chrF")]
                if translation else ["test NLL (eval-lm)", "test perplexity"])
    columns += ["gain g at the end"]
    out = [f"### {title}", "", "| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    for row in rows:
        reach = ", ".join("never" if r == float("inf") else f"{r:.0f}" for r in row["reach"])
        cells = [row["arm"], str(row["n"]), row["step0"].format(3), reach,
                 row["best_nll"].format(3), ", ".join(map(str, row["best_update"])),
                 ", ".join(map(str, row["last_update"]))]
        if translation:
            for index, _ in enumerate(test_sets):
                suffix = "" if index == 0 else f"_{test_sets[index]}"
                cells += [row[f"bleu{suffix}"].format(2), row[f"chrf{suffix}"].format(2)]
        else:
            cells += [row["test_nll"].format(3), row["test_ppl"].format(2)]
        cells += [row["gain"].format(2) if row["gain"] else ""]
        out.append("| " + " | ".join(cells) + " |")
    ce = [row["unigram_ce"] for row in rows if row["unigram_ce"]]
    if ce:
        out += ["", f"Unigram cross-entropy of the validation targets: {ce[0].mean:.3f} bits."]
    stop = (f"Each run stopped when its validation NLL had not improved for {patience} "
            "validations (fairseq's --patience) or at the update cap" if patience > 0 else
            "Each run trained for the same budget of updates (no --patience; a run that "
            "an earlier patience had stopped was resumed to it)")
    out += [f"{stop}; its best checkpoint (lowest validation NLL) is scored, beam 5. "
            "Mean ± standard error over seeds."]
    if translation:
        out += [f"BLEU signature: `{rows[0]['signatures'][0]}`; "
                f"chrF: `{rows[0]['signatures'][1]}`"]
    reference = next((row for row in rows if row["arm"] == REFERENCE_ARM), None)
    stock_best = float(np.mean(reference["best_update"])) if reference else None
    return "\n".join(out + comparisons(rows, stock_best)) + "\n"


# Pairs of arms compared in the text under the table: the bias under one weight
# init, and the default against stock fairseq.
COMPARED = (("gain/unigram", "gain/zero"), ("fairseq/unigram", "fairseq/zero"),
            ("gain/unigram", "stock"), ("gain/zero", "stock"))


def comparisons(rows, reference_updates=None):
    """Differences of means with the standard error of the difference
    (sqrt(se_a^2 + se_b^2), seeds independent), and the mean ratio of updates
    to reach stock's last validation NLL to the updates of a run, or, given
    ``reference_updates`` (a --converge study), to stock's mean update of its
    best validation NLL."""
    by_arm = {row["arm"]: row for row in rows}
    test_sets = sorted(key[len("bleu_"):] for key in (rows[0] if rows else {})
                       if key.startswith("bleu_"))
    keys = (("alc_bleu", "ALC of valid BLEU"), ("bleu", "test BLEU"),
            *((f"bleu_{t}", f"{t} BLEU") for t in test_sets), ("test_ppl", "test ppl"),
            ("alc", "ALC of valid NLL"), ("best_nll", "best valid NLL"))
    lines = []
    for a, b in COMPARED:
        if a not in by_arm or b not in by_arm:
            continue
        parts = []
        for key, label in keys:
            if key not in by_arm[a]:
                continue
            x, y = by_arm[a][key], by_arm[b][key]
            se = math.sqrt(x.stderr ** 2 + y.stderr ** 2)  # nan with a single seed
            spread = (f" (s.e. {se:.3f}, {(x.mean - y.mean) / se:.1f} s.e.)"
                      if math.isfinite(se) and se > 0 else " (one seed: no s.e.)")
            parts.append(f"{label} {x.mean - y.mean:+.3f}{spread}")
        reach = [r for r in by_arm[a]["reach"] if math.isfinite(r)]
        if reach and by_arm[a]["reach"]:
            span = reference_updates or by_arm[a]["final_update"]
            of = (f"stock's {span:.0f} to its best" if reference_updates
                  else f"{by_arm[a]['final_update']}")
            parts.append(f"updates to reach stock: {np.mean(reach) / span:.2f}x of {of}"
                         + ("" if len(reach) == len(by_arm[a]["reach"]) else " (some never)"))
        lines.append(f"- {a} − {b}: " + "; ".join(parts))
    return ["", "Differences:"] + lines if lines else []


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--multi30k", default=os.environ.get("NATBIAS_MULTI30K",
                                                             "../shared/data/multi30k"))
    parser.add_argument("--workdir", default="work/study")
    parser.add_argument("--task", default="translation", choices=["translation", "lm"])
    parser.add_argument("--pair", default="de-en", choices=["de-en", "fr-en"],
                        help="with --task translation")
    parser.add_argument("--lang", default="en", choices=["en", "de", "fr"],
                        help="with --task lm")
    parser.add_argument("--schedule", default="short", choices=sorted(SCHEDULES))
    parser.add_argument("--arms", nargs="+", default=[
        "stock", "gain/unigram", "gain/zero", "gain/none",
        "fairseq/unigram", "fairseq/zero", "fairseq/none"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--max-update", type=int,
                        help="updates per run (default 1000; with --converge, the cap: 12000; "
                             "a --converge run its cap stopped trains on to a higher cap)")
    parser.add_argument("--max-tokens", type=int, default=1500)
    parser.add_argument("--validate-every", type=int,
                        help="updates between validations (default 50; with --converge 250)")
    parser.add_argument("--converge", action="store_true",
                        help="train each run until its validation NLL has not improved for "
                             "--patience validations (best checkpoint: lowest validation NLL; "
                             "no BLEU during training; translation also scored on "
                             "test_2017_flickr); runs and results are named <setting>-converge")
    parser.add_argument("--patience", type=int, default=6,
                        help="with --converge: validations without improvement before a run "
                             "stops; 0: a fixed budget of --max-update updates (runs stopped "
                             "by their patience train on to it)")
    parser.add_argument("--jobs", type=int, default=2, help="trainings side by side")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per training")
    parser.add_argument("--summarise-only", action="store_true",
                        help="no training: the table and plots of the finished runs")
    parser.add_argument("--results", help="also copy the table and plots to this folder")
    parser.add_argument("--untied", action="store_true",
                        help="untied output projection (no embedding sharing); runs and "
                             "results are named <schedule>-untied")
    parser.add_argument("--time-updates", type=int, metavar="N",
                        help="no study: time N updates of each arm (no validation, no "
                             "checkpoint) and print seconds per update, to plan a study")
    parser.add_argument("--train-pairs", type=int, metavar="N",
                        help="translation on the first N training pairs only (a small "
                             "corpus), SentencePiece vocabulary scaled with sqrt(N) "
                             "(8,000 at 29,000); runs and results are named <pair>_nN")
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="translation at a paper size instead of the small model (2+2, "
                             "d 128): iwslt (6+6, d 256, FFN 256, 4 heads); results named "
                             "<schedule>-iwslt")
    args = parser.parse_args()
    arms = [Arm.parse(text) for text in args.arms]
    if args.preset and args.task != "translation":
        raise SystemExit("study: --preset is for --task translation")
    if args.max_update is None:
        args.max_update = 12000 if args.converge else 1000
    if args.validate_every is None:
        args.validate_every = 250 if args.converge else 50
    task = (Translation(args.pair, CONVERGE_TEST_SETS[1:] if args.converge else ())
            if args.task == "translation" else LanguageModel(args.lang))
    if args.preset:
        task.use_preset(args.preset)
    if args.untied:
        task.options = [o for o in task.options if o not in TYING_OPTIONS]
    if args.converge:
        task.options = [*converge_options(task.options, task.loss_key), "--patience",
                        str(args.patience)]
    raw = Path(args.multi30k)
    langs = task.langs if args.task == "translation" else (task.lang,)
    if not has_all_files(raw, langs):
        raise SystemExit(f"study: no Multi30k {'-'.join(langs)} at {raw}; give --multi30k DIR")
    if args.train_pairs:
        if args.task != "translation":
            raise SystemExit("study: --train-pairs is for --task translation")
        task.folder = f"{task.folder}_n{args.train_pairs}"
        task.vocab_size = vocabulary_for(args.train_pairs)
    work = Path(args.workdir).resolve() / task.folder
    work.mkdir(parents=True, exist_ok=True)
    if args.train_pairs:
        raw = first_pairs(raw, work / "raw", langs, args.train_pairs)
    setting = args.setting = (args.schedule + ("-untied" if args.untied else "")
                              + (f"-{args.preset}" if args.preset else "")
                              + ("-converge" if args.converge else ""))
    study_dir = work / setting
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    data_bin = task.prepare(raw, work)
    if args.time_updates:
        time_updates(task, data_bin, arms, args)
        return
    if not args.summarise_only:
        # Seed by seed, the reference arm first in each: a study cut short
        # still compares the arms (the others' "updates to reach" need stock).
        plan = sorted(((arm, seed) for seed in args.seeds for arm in arms),
                      key=lambda job: (job[1], job[0].name != REFERENCE_ARM))
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for job in [pool.submit(train_and_score, task, data_bin, work,
                                    study_dir / arm.folder / f"seed{seed}", arm, seed, args)
                        for arm, seed in plan]:
                job.result()
    archive = (Path(args.results) / "runs" / f"{task.folder}_{setting}"
               if args.results else None)
    runs = collect_runs(task, study_dir, arms, args.seeds, archive,
                        with_bleu_curve=task.name == "translation" and not args.converge)
    rows, target, nll_lines, bleu_lines = summarise(task, runs, args.converge)
    if not rows:
        raise SystemExit("study: no finished run yet")
    title = (f"Multi30k {args.pair}"
             + (f", first {args.train_pairs:,} pairs (SentencePiece {task.vocab_size:,})"
                if args.train_pairs else "")
             + f", schedule {setting}" if args.task == "translation"
             else f"language model, Multi30k {args.lang}, schedule {setting}")
    table = (markdown_converged(rows, target, title, CONVERGE_TEST_SETS, args.patience)
             if args.converge
             else markdown(rows, target, title))
    outputs = {"md": study_dir / "study.md", "nll": study_dir / "study_valid_nll.png",
               "bleu": study_dir / "study_valid_bleu.png"}
    if args.converge:
        found = reach_by_horizon(runs)
        table += markdown_reach_by_horizon(found)
        if found:
            outputs["reach"] = study_dir / "study_reach_by_horizon.png"
            plots.curve_panels({title: [reach_line(name, horizons, ratios)
                                        for name, (horizons, ratios) in found.items()]},
                "updates to reach stock at h / h", str(outputs["reach"]), logx=True)
    outputs["md"].write_text(table)
    nll_panels = {title: nll_lines}
    if args.converge:  # the end of a long run, where the arms differ by hundredths
        nll_panels[f"from update {ZOOM_FROM:,}"] = [from_update(line, ZOOM_FROM)
                                                   for line in nll_lines]
    plots.curve_panels(nll_panels, "validation NLL (bits/token)", str(outputs["nll"]),
                       logx=False)
    if bleu_lines:
        plots.curve_panels({title: bleu_lines}, "validation BLEU (greedy)",
                           str(outputs["bleu"]), logx=False)
    else:
        del outputs["bleu"]
    if args.results:
        results = Path(args.results)
        results.mkdir(parents=True, exist_ok=True)
        for path in outputs.values():
            shutil.copy(path, results / f"{task.folder}_{setting}_{path.name}")
    print(table)
    print(f"outputs: {', '.join(str(p) for p in outputs.values())}; "
          f"command: {sys.executable} {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
