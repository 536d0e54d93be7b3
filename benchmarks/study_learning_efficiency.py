"""The paper's learning-efficiency claim, measured on real data (issue 6).

On Multi30k De->En (joint SentencePiece 8k), a small transformer_natbias
(2+2 layers, d = 128, tied) trained on the CPU through the real fairseq-train,
for each weight initialisation x bias init x seed, validating every
--validate-every updates:

* validation NLL at update 0 (natbias-step0) and over updates;
* validation BLEU over updates (fairseq's own --eval-bleu: greedy, sacreBLEU
  13a on detokenised SentencePiece, the whole validation set);
* ALC of the validation NLL over the run, update 0 included, and ALC of the
  validation BLEU from the first validation on (the paper's Fig. 3 measure;
  natbias-alc's trapezoidal rule divided by the span of updates);
* updates each run needs to reach the zero-bias model's validation NLL at
  --reference-update (mean over the zero runs; interpolated between
  validations; "never" if not reached);
* test BLEU/chrF (sacreBLEU) of the best checkpoint (highest validation BLEU,
  the paper's early stopping), beam 5;
* means and standard errors over seeds, as a Markdown table and two plots.

Every run goes to --workdir/<weight-init>/<init>/seed<k>/; finished runs are
skipped and an interrupted one resumes from its last checkpoint, so the study
can be run in parts and extended (more seeds, more updates) run by run.
--jobs runs that many trainings side by side, each on --threads CPU threads
(on the 2-core machine two 1-thread runs go ~10% faster than one 2-thread run
after the other). The table covers the finished runs only and says n.

    .venv/bin/python benchmarks/study_learning_efficiency.py \
        --weight-inits damped fairseq paper --seeds 1 2 3 --max-update 1000
"""

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fairseq_natbias.analysis import alc, fairseq_logs, plots  # noqa: E402
from fairseq_natbias.analysis.stats import mean_stderr  # noqa: E402
from fairseq_natbias.cli import demo  # noqa: E402

INITS = ("unigram", "zero", "none")
# Greedy and length-capped: an untrained model's validation translations
# would otherwise run to fairseq's default limit of 200 tokens.
# The best checkpoint is the one with the best validation BLEU, as in the
# paper's early stopping (Sec. 4.1).
EVAL_BLEU = ["--eval-bleu", "--eval-bleu-args", '{"beam": 1, "max_len_a": 1.2, "max_len_b": 10}',
             "--eval-bleu-remove-bpe", "sentencepiece",
             "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric"]


def training_arguments(data_bin, run_dir, weight_init, init, seed, args):
    training = list(demo.TRAINING)
    for option, value in (("--seed", seed), ("--max-tokens", args.max_tokens),
                          ("--validate-interval-updates", args.validate_every),
                          ("--save-interval-updates", args.validate_every)):
        training[training.index(option) + 1] = str(value)
    return [str(data_bin), "--user-dir", "fairseq_natbias", "--arch", "transformer_natbias",
            "--natbias-init", init, "--natbias-weight-init", weight_init,
            *demo.MODEL, *training, *EVAL_BLEU, "--max-update", str(args.max_update),
            "--save-dir", str(run_dir)]


def train_and_score(data_bin, workdir, run_dir, weight_init, init, seed, args):
    """One run, start to test score; each step skipped when its output exists."""
    name = f"{weight_init}/{init}/seed{seed}"
    if not (run_dir / "done").exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        arguments = training_arguments(data_bin, run_dir, weight_init, init, seed, args)
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
    demo.evaluate(data_bin, workdir, run_dir, name)


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


def finished(run_dir):
    return (run_dir / "done").exists() and (run_dir / "test_scores.json").exists()


def band(curves):
    """Mean ± standard error over seeds on the first run's grid."""
    grid = curves[0][0]
    stacked = np.array([np.interp(grid, u, v) for u, v in curves])
    mean = stacked.mean(0)
    se = stacked.std(0, ddof=1) / np.sqrt(len(curves)) if len(curves) > 1 else 0 * mean
    return grid, mean, se


def summarise(workdir, weight_inits, seeds, reference_update):
    rows, nll_panels, bleu_panels = [], {}, {}
    for weight_init in weight_inits:
        runs = {init: [r for r in (workdir / weight_init / init / f"seed{s}" for s in seeds)
                       if finished(r)] for init in INITS}
        if not all(runs.values()):
            continue
        target = float(np.mean([np.interp(reference_update, *curve(r)) for r in runs["zero"]]))
        nll_lines, bleu_lines = [], []
        for init, run_dirs in runs.items():
            nll = [curve(r) for r in run_dirs]
            bleu = [curve(r, "bleu") for r in run_dirs]
            scores = [json.loads((r / "test_scores.json").read_text()) for r in run_dirs]
            rows.append({
                "weight_init": weight_init, "init": init,
                "step0": mean_stderr([v[0] for _, v in nll]),
                "alc": mean_stderr([alc.area_under_learning_curve(u, v).alc for u, v in nll]),
                "alc_bleu": mean_stderr([alc.area_under_learning_curve(u, v).alc
                                         for u, v in bleu]),
                "reach": [updates_to_reach(u, v, target) for u, v in nll],
                "final_nll": mean_stderr([v[-1] for _, v in nll]),
                "final_bleu": mean_stderr([v[-1] for _, v in bleu]),
                "bleu": mean_stderr([s["bleu"] for s in scores]),
                "chrf": mean_stderr([s["chrf"] for s in scores]),
                "signatures": (scores[0]["bleu_signature"], scores[0]["chrf_signature"]),
            })
            for lines, curves in ((nll_lines, nll), (bleu_lines, bleu)):
                grid, mean, se = band(curves)
                lines.append({"label": init, "x": grid, "mean": mean,
                              "low": mean - se, "high": mean + se})
        nll_panels[f"weight init: {weight_init}"] = nll_lines
        bleu_panels[f"weight init: {weight_init}"] = bleu_lines
    return rows, nll_panels, bleu_panels


def markdown(rows, reference_update, max_update):
    out = [f"| weight init | bias | valid NLL at update 0 | ALC of valid NLL | ALC of valid "
           f"BLEU (greedy) | updates to "
           f"reach zero@{reference_update} (per seed) | valid NLL @{max_update} | "
           f"valid BLEU @{max_update} (greedy) | test BLEU | test chrF |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        reach = ", ".join("never" if r == float("inf") else f"{r:.0f}" for r in row["reach"])
        out.append(f"| {row['weight_init']} | {row['init']} | {row['step0'].format(3)} | "
                   f"{row['alc'].format(3)} | {row['alc_bleu'].format(2)} | {reach} | {row['final_nll'].format(3)} | "
                   f"{row['final_bleu'].format(2)} | {row['bleu'].format(2)} | "
                   f"{row['chrf'].format(2)} |")
    if rows:
        out += ["", f"test BLEU signature: `{rows[0]['signatures'][0]}`",
                f"test chrF signature: `{rows[0]['signatures'][1]}`"]
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--multi30k", default=os.environ.get("NATBIAS_MULTI30K",
                                                             "../shared/data/multi30k"))
    parser.add_argument("--workdir", default="work/study")
    parser.add_argument("--weight-inits", nargs="+", default=["damped", "fairseq", "paper"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--max-update", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=1500)
    parser.add_argument("--validate-every", type=int, default=50)
    parser.add_argument("--reference-update", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=2, help="trainings side by side")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per training")
    parser.add_argument("--summarise-only", action="store_true",
                        help="no training: the table and plots of the finished runs")
    args = parser.parse_args()
    if not Path(args.multi30k).is_dir():
        raise SystemExit(f"study: no Multi30k at {args.multi30k}; give --multi30k DIR")
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    data_bin = demo.prepare(Path(args.multi30k), workdir, vocab_size=8000)
    if not args.summarise_only:
        plan = [(w, init, seed) for w in args.weight_inits for seed in args.seeds
                for init in INITS]
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for job in [pool.submit(train_and_score, data_bin, workdir,
                                    workdir / w / init / f"seed{seed}", w, init, seed, args)
                        for w, init, seed in plan]:
                job.result()
    rows, nll_panels, bleu_panels = summarise(workdir, args.weight_inits, args.seeds,
                                              args.reference_update)
    if not rows:
        raise SystemExit("study: no weight init has a finished run of every bias init yet")
    table = markdown(rows, args.reference_update, args.max_update)
    (workdir / "study.md").write_text(table)
    plots.curve_panels(nll_panels, "validation NLL (bits/token)",
                       str(workdir / "study_valid_nll.png"), logx=False)
    plots.curve_panels(bleu_panels, "validation BLEU (greedy)",
                       str(workdir / "study_valid_bleu.png"), logx=False)
    print(table)
    print(f"outputs: {workdir}/study.md, study_valid_nll.png, study_valid_bleu.png; "
          f"command: {sys.executable} {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
