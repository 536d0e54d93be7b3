"""The paper's learning-efficiency claim, measured on real data (issue 6).

On Multi30k De->En (joint SentencePiece 8k), a small transformer_natbias
(2+2 layers, d = 128, tied) trained on the CPU through the real fairseq-train,
for each weight initialisation x bias init x seed, validating every
--validate-every updates:

* validation NLL at update 0 (natbias-step0) and over updates;
* ALC of the validation NLL over the run (natbias-alc's trapezoidal rule;
  lower is better for a loss);
* updates each run needs to reach the zero-bias model's validation NLL at
  --reference-update (interpolated between validations; "never" if not reached);
* test BLEU/chrF (sacreBLEU) of the best checkpoint, beam 5;
* means and standard errors over seeds, as a Markdown table and a plot.

Every run goes to --workdir/<weight-init>/<init>/seed<k>/; finished runs are
skipped, so the study can be extended (more seeds, more updates) run by run.

    .venv/bin/python benchmarks/study_learning_efficiency.py \
        --weight-inits damped fairseq paper --seeds 1 2 3 --max-update 1000
"""

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fairseq_natbias.analysis import alc, fairseq_logs, plots  # noqa: E402
from fairseq_natbias.analysis.stats import mean_stderr  # noqa: E402
from fairseq_natbias.cli import demo  # noqa: E402

INITS = ("unigram", "zero", "none")


def train_run(data_bin, run_dir, weight_init, init, seed, args):
    if (run_dir / "done").exists():
        demo.say(f"{run_dir}: finished before, skipped")
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    training = list(demo.TRAINING)
    for option, value in (("--seed", seed), ("--validate-interval-updates", args.validate_every),
                          ("--save-interval-updates", args.validate_every)):
        training[training.index(option) + 1] = str(value)
    arguments = [str(data_bin), "--user-dir", "fairseq_natbias", "--arch", "transformer_natbias",
                 "--natbias-init", init, "--natbias-weight-init", weight_init,
                 *demo.MODEL, *training, "--max-update", str(args.max_update),
                 "--save-dir", str(run_dir)]
    demo.record_step0(arguments, run_dir / "step0.json")
    demo.say(f"train {weight_init}/{init}/seed{seed}: {args.max_update} updates")
    demo.run([demo.tool("fairseq-train"), *arguments], log_path=run_dir / "train.log")
    (run_dir / "done").touch()


def curve(run_dir):
    records = fairseq_logs.read_log(str(run_dir / "train.log"))
    updates, values = fairseq_logs.series(records, fairseq_logs.VALID, "nll_loss")
    step0 = json.loads((run_dir / "step0.json").read_text())["nll"]
    return np.concatenate([[0.0], updates]), np.concatenate([[step0], values])


def updates_to_reach(updates, values, target):
    """First update at which the (interpolated) curve is at or below target."""
    for i in range(len(values)):
        if values[i] <= target:
            if i == 0:
                return 0.0
            u0, u1, v0, v1 = updates[i - 1], updates[i], values[i - 1], values[i]
            return float(u0 + (u1 - u0) * (v0 - target) / (v0 - v1))
    return float("inf")


def summarise(workdir, data_bin, weight_inits, seeds, reference_update):
    rows, plot_panels = [], {}
    for weight_init in weight_inits:
        runs = {init: [workdir / weight_init / init / f"seed{s}" for s in seeds] for init in INITS}
        reference = [np.interp(reference_update, *curve(r)) for r in runs["zero"]]
        target = float(np.mean(reference))
        lines = []
        for init, run_dirs in runs.items():
            curves = [curve(r) for r in run_dirs]
            scores = [demo.evaluate(data_bin, workdir, r, init) for r in run_dirs]
            alcs = [alc.area_under_learning_curve(u, v).alc for u, v in curves]
            reach = [updates_to_reach(u, v, target) for u, v in curves]
            rows.append((weight_init, init, mean_stderr([v[0] for _, v in curves]),
                         mean_stderr(alcs), reach, mean_stderr([s["bleu"] for s in scores]),
                         mean_stderr([s["chrf"] for s in scores])))
            grid = curves[0][0]
            stacked = np.array([np.interp(grid, u, v) for u, v in curves])
            mean, se = stacked.mean(0), stacked.std(0, ddof=1) / np.sqrt(len(curves)) \
                if len(curves) > 1 else np.zeros_like(grid)
            lines.append({"label": init, "x": grid, "mean": mean, "low": mean - se,
                          "high": mean + se})
        plot_panels[f"weight init: {weight_init}"] = lines
    return rows, plot_panels


def markdown(rows, reference_update):
    out = [f"| weight init | bias | NLL at update 0 | ALC of valid NLL | updates to reach "
           f"zero@{reference_update} | test BLEU | test chrF |",
           "|---|---|---|---|---|---|---|"]
    for weight_init, init, step0, area, reach, bleu, chrf in rows:
        reach_text = ", ".join("never" if r == float("inf") else f"{r:.0f}" for r in reach)
        out.append(f"| {weight_init} | {init} | {step0.format(3)} | {area.format(3)} | "
                   f"{reach_text} | {bleu.format(2)} | {chrf.format(2)} |")
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
    parser.add_argument("--validate-every", type=int, default=50)
    parser.add_argument("--reference-update", type=int, default=200)
    args = parser.parse_args()
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    data_bin = demo.prepare(Path(args.multi30k), workdir, vocab_size=8000)
    for weight_init in args.weight_inits:
        for seed in args.seeds:
            for init in INITS:
                train_run(data_bin, workdir / weight_init / init / f"seed{seed}",
                          weight_init, init, seed, args)
    rows, panels = summarise(workdir, data_bin, args.weight_inits, args.seeds,
                                     args.reference_update)
    table = markdown(rows, args.reference_update)
    (workdir / "study.md").write_text(table)
    plots.curve_panels(panels, "validation NLL (bits/token)", str(workdir / "study.png"),
                       logx=False)
    print(table)
    print(f"outputs: {workdir}/study.md, study.png; command: {sys.executable} {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
