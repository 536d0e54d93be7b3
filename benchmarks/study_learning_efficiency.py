"""The paper's learning-efficiency claim, measured on real data against stock
fairseq (issues 6 and 10).

On Multi30k (joint SentencePiece 8k; --pair de-en or fr-en), a small model
(2+2 layers, d = 128, tied embeddings) trained on the CPU through the real
fairseq-train, for each arm x seed under a learning-rate schedule:

arms
    ``stock``                   fairseq's own ``--arch transformer`` (what a user
                                would otherwise run; no bias)
    ``WINIT/BIAS``              ``--arch transformer_natbias`` with
                                ``--natbias-weight-init WINIT --natbias-init BIAS``,
                                e.g. ``gain/unigram``, ``fairseq/zero``
    ``gain@G0,C/BIAS``          the ``gain`` init with ``--natbias-gain-init G0
                                --natbias-gain-speed C`` (for screening)
schedules (``--schedule``)
    ``short``  lr 1e-3, inverse-sqrt warm-up 100 updates (the demo's)
    ``paper``  lr 5e-4, inverse-sqrt warm-up 4,000 updates from 1e-7 (the
               paper's sec. 4.1 schedule, as in the recipes)

Measured per run, validating every --validate-every updates:

* validation NLL at update 0 (natbias-step0) and over updates, with the
  unigram cross-entropy of the validation targets for reference;
* validation BLEU over updates (fairseq's own --eval-bleu: greedy, sacreBLEU
  13a on detokenised SentencePiece, the whole validation set);
* ALC of the validation NLL (update 0 included) and of the validation BLEU
  (from the first validation; the paper's Fig. 3 measure): trapezoidal rule
  divided by the span of updates (natbias-alc's);
* updates needed to reach the reference arm's (``stock``) validation NLL at
  its last update (mean over its seeds; interpolated; "never" if not reached);
* test BLEU/chrF (sacreBLEU, with signatures) of the best checkpoint (highest
  validation BLEU: the paper's early stopping), beam 5;
* the gain g at the end, for the ``gain`` init.

Means and standard errors over seeds go to a Markdown table and plots in
--workdir/<pair>/<schedule>/; the runs to <pair>/<schedule>/<arm>/seed<k>/.
Finished runs are skipped and an interrupted one resumes from its last
checkpoint, so the study runs in parts and extends run by run. --jobs runs
that many trainings side by side on --threads CPU threads each (on the 2-core
machine two 1-thread runs beat one 2-thread run after the other).

    .venv/bin/python benchmarks/study_learning_efficiency.py --pair de-en \\
        --schedule short --seeds 1 2 3 \\
        --arms stock gain/unigram gain/zero gain/none fairseq/unigram fairseq/zero fairseq/none
"""

import argparse
import json
import os
import re
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fairseq_natbias.analysis import alc, fairseq_logs, plots  # noqa: E402
from fairseq_natbias.analysis.stats import mean_stderr  # noqa: E402
from fairseq_natbias.cli import demo  # noqa: E402

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


@dataclass(frozen=True)
class Arm:
    """One configuration of the comparison (see the module docstring)."""

    name: str
    weight_init: Optional[str] = None
    bias: Optional[str] = None
    gain_init: Optional[str] = None
    gain_speed: Optional[str] = None

    @classmethod
    def parse(cls, text):
        if text == REFERENCE_ARM:
            return cls(text)
        match = re.fullmatch(r"(\w+)(?:@([\d.e-]+),([\d.e-]+))?/(unigram|zero|none)", text)
        if not match:
            raise SystemExit(f"study: bad arm {text!r}: give stock, WINIT/BIAS or gain@G0,C/BIAS")
        weight_init, gain_init, gain_speed, bias = match.groups()
        return cls(text, weight_init, bias, gain_init, gain_speed)

    @property
    def folder(self):
        return self.name.replace("/", "-").replace("@", "_").replace(",", "_")

    def model_arguments(self):
        if self.name == REFERENCE_ARM:
            return ["--arch", "transformer"]
        options = ["--arch", "transformer_natbias", "--natbias-init", self.bias,
                   "--natbias-weight-init", self.weight_init]
        if self.gain_init:
            options += ["--natbias-gain-init", self.gain_init,
                        "--natbias-gain-speed", self.gain_speed]
        return options


def training_arguments(data_bin, run_dir, arm, seed, args):
    training = list(demo.TRAINING)
    overrides = {"--seed": seed, "--max-tokens": args.max_tokens,
                 "--validate-interval-updates": args.validate_every,
                 "--save-interval-updates": args.validate_every,
                 **SCHEDULES[args.schedule]}
    for option, value in overrides.items():
        if option in training:
            training[training.index(option) + 1] = str(value)
        else:
            training += [option, str(value)]
    # --user-dir for stock too: it registers new names only, and lets torch >=
    # 2.6 load fairseq checkpoints (fairseq_natbias/checkpoint_loading.py).
    return [str(data_bin), "--user-dir", "fairseq_natbias", *arm.model_arguments(),
            *demo.MODEL, *training, *EVAL_BLEU, "--max-update", str(args.max_update),
            "--save-dir", str(run_dir)]


def train_and_score(data_bin, work, run_dir, arm, seed, args):
    """One run, start to test score; each step skipped when its output exists."""
    name = f"{args.pair} {args.schedule} {arm.name} seed{seed}"
    if not (run_dir / "done").exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        arguments = training_arguments(data_bin, run_dir, arm, seed, args)
        demo.record_step0(arguments, run_dir / "step0.json")
        started = time.time()
        demo.say(f"{name}: training, {args.max_update} updates")

        def progress(line):
            record = fairseq_logs.parse_line(line.rstrip("\n"))
            if record and record.tag == fairseq_logs.VALID and "nll_loss" in record.values:
                demo.say(f"{name}: update {record.num_updates}/{args.max_update} valid NLL "
                         f"{record.values['nll_loss']:.3f} BLEU {record.values.get('bleu', 0):.2f}")

        demo.run([demo.tool("fairseq-train"), *arguments], log_path=run_dir / "train.log",
                 on_line=progress)
        (run_dir / "done").touch()
        demo.say(f"{name}: trained in {time.time() - started:.0f} s")
    demo.evaluate(data_bin, work, run_dir, name, target=args.pair.split("-")[1])
    for checkpoint in run_dir.glob("checkpoint_*_*.pt"):  # interval checkpoints
        checkpoint.unlink()


def curve(run_dir, key="nll_loss"):
    """Validation curve of key; NLL starts at update 0 (the demo's curve)."""
    if key == "nll_loss":
        by_update = demo.validation_curve(run_dir)
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


def finished(run_dir):
    return (run_dir / "done").exists() and (run_dir / "test_scores.json").exists()


def band(curves):
    """Mean ± standard error over seeds on the first run's grid."""
    grid = curves[0][0]
    stacked = np.array([np.interp(grid, u, v) for u, v in curves])
    mean = stacked.mean(0)
    se = stacked.std(0, ddof=1) / np.sqrt(len(curves)) if len(curves) > 1 else 0 * mean
    return grid, mean, se


def summarise(study_dir, arms, seeds):
    """Rows of the table and the curves of the plots, over finished runs."""
    runs = {arm: [r for r in (study_dir / arm.folder / f"seed{s}" for s in seeds) if finished(r)]
            for arm in arms}
    runs = {arm: dirs for arm, dirs in runs.items() if dirs}
    reference = next((dirs for arm, dirs in runs.items() if arm.name == REFERENCE_ARM), None)
    target = (float(np.mean([curve(r)[1][-1] for r in reference])) if reference else None)
    rows, nll_lines, bleu_lines = [], [], []
    for arm, run_dirs in runs.items():
        nll = [curve(r) for r in run_dirs]
        bleu = [curve(r, "bleu") for r in run_dirs]
        scores = [json.loads((r / "test_scores.json").read_text()) for r in run_dirs]
        step0 = [json.loads((r / "step0.json").read_text()) for r in run_dirs]
        gains = [g for g in (last_gain(r) for r in run_dirs) if g is not None]
        rows.append({
            "arm": arm.name, "n": len(run_dirs),
            "step0": mean_stderr([v[0] for _, v in nll]),
            "unigram_ce": (mean_stderr([s["unigram_ce"] for s in step0])
                           if all("unigram_ce" in s for s in step0) else None),
            "alc": mean_stderr([alc.area_under_learning_curve(u, v).alc for u, v in nll]),
            "alc_bleu": mean_stderr([alc.area_under_learning_curve(u, v).alc for u, v in bleu]),
            "reach": ([updates_to_reach(u, v, target) for u, v in nll]
                      if target is not None else []),
            "final_update": int(nll[0][0][-1]),
            "final_nll": mean_stderr([v[-1] for _, v in nll]),
            "final_bleu": mean_stderr([v[-1] for _, v in bleu]),
            "bleu": mean_stderr([s["bleu"] for s in scores]),
            "chrf": mean_stderr([s["chrf"] for s in scores]),
            "gain": mean_stderr(gains) if gains else None,
            "signatures": (scores[0]["bleu_signature"], scores[0]["chrf_signature"]),
        })
        for lines, curves in ((nll_lines, nll), (bleu_lines, bleu)):
            grid, mean, se = band(curves)
            lines.append({"label": arm.name, "x": grid, "mean": mean,
                          "low": mean - se, "high": mean + se})
    return rows, target, nll_lines, bleu_lines


def markdown(rows, target, title):
    reach_head = (f"updates to reach stock's valid NLL at its last update "
                  f"({target:.3f}), per seed" if target is not None else "updates to reach stock")
    out = [f"### {title}", "",
           f"| arm | n | valid NLL at update 0 | ALC of valid NLL | ALC of valid BLEU (greedy) "
           f"| {reach_head} | valid NLL at the end | valid BLEU at the end (greedy) "
           f"| test BLEU | test chrF | gain g at the end |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        reach = ", ".join("never" if r == float("inf") else f"{r:.0f}" for r in row["reach"])
        out.append(
            f"| {row['arm']} | {row['n']} | {row['step0'].format(3)} | {row['alc'].format(3)} | "
            f"{row['alc_bleu'].format(2)} | {reach} | {row['final_nll'].format(3)} | "
            f"{row['final_bleu'].format(2)} | {row['bleu'].format(2)} | {row['chrf'].format(2)} | "
            f"{row['gain'].format(2) if row['gain'] else ''} |")
    ce = [row["unigram_ce"] for row in rows if row["unigram_ce"]]
    if ce:
        out += ["", f"Unigram cross-entropy of the validation targets: {ce[0].mean:.3f} bits."]
    if rows:
        out += [f"Updates per run: {rows[0]['final_update']}. Mean ± standard error over seeds.",
                f"test BLEU signature: `{rows[0]['signatures'][0]}`; "
                f"chrF: `{rows[0]['signatures'][1]}`"]
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--multi30k", default=os.environ.get("NATBIAS_MULTI30K",
                                                             "../shared/data/multi30k"))
    parser.add_argument("--workdir", default="work/study")
    parser.add_argument("--pair", default="de-en", choices=["de-en", "fr-en"])
    parser.add_argument("--schedule", default="short", choices=sorted(SCHEDULES))
    parser.add_argument("--arms", nargs="+", default=[
        "stock", "gain/unigram", "gain/zero", "gain/none",
        "fairseq/unigram", "fairseq/zero", "fairseq/none"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--max-update", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=1500)
    parser.add_argument("--validate-every", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=2, help="trainings side by side")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per training")
    parser.add_argument("--summarise-only", action="store_true",
                        help="no training: the table and plots of the finished runs")
    parser.add_argument("--results", help="also copy the table and plots to this folder")
    args = parser.parse_args()
    arms = [Arm.parse(text) for text in args.arms]
    raw = Path(args.multi30k)
    langs = tuple(args.pair.split("-"))
    if not demo.has_all_files(raw, langs):
        raise SystemExit(f"study: no Multi30k {args.pair} at {raw}; give --multi30k DIR")
    work = Path(args.workdir).resolve() / args.pair
    work.mkdir(parents=True, exist_ok=True)
    study_dir = work / args.schedule
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    data_bin = demo.prepare(raw, work, vocab_size=8000, langs=langs)
    if not args.summarise_only:
        # The reference arm first: the other arms' "updates to reach" need it.
        plan = sorted(((arm, seed) for seed in args.seeds for arm in arms),
                      key=lambda job: (job[0].name != REFERENCE_ARM, job[1]))
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for job in [pool.submit(train_and_score, data_bin, work,
                                    study_dir / arm.folder / f"seed{seed}", arm, seed, args)
                        for arm, seed in plan]:
                job.result()
    rows, target, nll_lines, bleu_lines = summarise(study_dir, arms, args.seeds)
    if not rows:
        raise SystemExit("study: no finished run yet")
    title = f"Multi30k {args.pair}, schedule {args.schedule}"
    table = markdown(rows, target, title)
    outputs = {"md": study_dir / "study.md", "nll": study_dir / "study_valid_nll.png",
               "bleu": study_dir / "study_valid_bleu.png"}
    outputs["md"].write_text(table)
    plots.curve_panels({title: nll_lines}, "validation NLL (bits/token)",
                       str(outputs["nll"]), logx=False)
    plots.curve_panels({title: bleu_lines}, "validation BLEU (greedy)",
                       str(outputs["bleu"]), logx=False)
    if args.results:
        results = Path(args.results)
        results.mkdir(parents=True, exist_ok=True)
        for path in outputs.values():
            shutil.copy(path, results / f"{args.pair}_{args.schedule}_{path.name}")
    print(table)
    print(f"outputs: {', '.join(str(p) for p in outputs.values())}; "
          f"command: {sys.executable} {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
