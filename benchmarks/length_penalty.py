"""Does a length penalty tuned on validation close a BLEU gap? The
length-penalty screen of a learning-efficiency study's best checkpoints
(issue 36: the criterion's 29,000-pair De->En test BLEU).

fairseq's beam search ranks finished hypotheses by

    score(y) = log p(y | x) / |y| ** lenpen,

so a lenpen above 1 favours longer outputs. The study decodes every run at
lenpen 1.0 (``pipeline.translate``). Here each run's best checkpoint
decodes the validation set at every lenpen of a grid; the lenpen with the
highest validation BLEU (the lower one on a tie) then decodes the test sets.
Each run is tuned on its own: a user would tune the model they keep, not
carry over another model's setting. Printed as a Markdown table, one row per
run: the chosen lenpen, validation BLEU and sacreBLEU's length ratio (c / r)
at 1.0 and at the chosen lenpen, and test BLEU at both; then, per arm, the
test BLEU change the tuning brought and the paired difference to the first
arm at each setting.

Every decode's scores are kept in RUN/lenpen/<split>_<lenpen>.json, so a
rerun (or a further arm) decodes only what is new; test BLEU at 1.0 is the
study's own (RUN/test_scores.json, RUN/<test set>_scores.json).

``--checkpoint last`` screens each run's checkpoint_last.pt instead (the
end of the study's budget, past the best): is a test-BLEU difference the
best checkpoint's alone, or the model's? Its decodes, test sets at 1.0
included, are kept as RUN/lenpen/<split>_<lenpen>_last.json. With
``--grid 1.0`` either checkpoint is only scored, not tuned.

    .venv/bin/python benchmarks/length_penalty.py /work/study/de-en/paper-converge \\
        --arms stock gain_0.05_20_abs-capped-unigram+unigram-ls --seeds 3 \\
        --out benchmarks/results/length_penalty_de-en_paper.md
"""

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from fairseq_natbias import pipeline  # noqa: E402
from fairseq_natbias.analysis.quality import bleu_score  # noqa: E402
from fairseq_natbias.analysis.stats import mean_stderr  # noqa: E402
from study.arms import CONVERGE_TEST_SETS, pair_target  # noqa: E402

GRID = (0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 2.0)
STUDY_LENPEN = 1.0


def split_sources(work, target):
    """``{split: (data-bin, subset, references)}``: the validation set and
    the study's test sets, as the study prepared them under WORK/<pair>."""
    first, *further = CONVERGE_TEST_SETS
    sources = {"valid": (work / "data-bin", "valid", work / "text" / f"valid.raw.{target}"),
               first: (work / "data-bin", "test", work / "text" / f"test.raw.{target}")}
    for name in further:
        sources[name] = (work / f"data-bin-{name}", "test",
                         work / f"text-{name}" / f"test.raw.{target}")
    return sources


def bleu_and_length(hypotheses, references):
    """sacreBLEU's BLEU and its length ratio c / r (below 1: shorter outputs)."""
    score, signature = bleu_score(hypotheses, references)
    return {"bleu": round(score.score, 2), "length_ratio": round(score.sys_len / score.ref_len, 4),
            "bleu_signature": signature}


def checkpoint_label(checkpoint):
    """What names a checkpoint other than the best in messages and titles."""
    return "" if checkpoint == "best" else f" (checkpoint_{checkpoint}.pt)"


def decode_scores(run_dir, split, source, lenpen, checkpoint="best"):
    """BLEU and length ratio of run_dir's checkpoint_<checkpoint>.pt on one
    split at one lenpen, decoded once and kept in run_dir/lenpen/ (the best
    checkpoint's validation translation at the study's lenpen also as
    run_dir/valid.hyp)."""
    suffix = "" if checkpoint == "best" else f"_{checkpoint}"
    kept = run_dir / "lenpen" / f"{split}_{lenpen:g}{suffix}.json"
    if kept.exists():
        return json.loads(kept.read_text())
    data_bin, subset, references_path = source
    if not references_path.is_file():
        raise SystemExit(f"length_penalty: no references {references_path} (give the study's "
                         "own WORK/<pair>/<setting> folder, with its text folders beside it)")
    pipeline.say(f"length_penalty: {run_dir} {split} at lenpen {lenpen:g}"
                 f"{checkpoint_label(checkpoint)}")
    hypotheses = pipeline.translate(data_bin, run_dir / f"checkpoint_{checkpoint}.pt", subset,
                                    lenpen)
    references = references_path.read_text(encoding="utf-8").splitlines()
    if len(hypotheses) != len(references):
        raise SystemExit(f"length_penalty: {len(hypotheses)} translations of {split} but "
                         f"{len(references)} references (was the decode cut short?)")
    scores = bleu_and_length(hypotheses, references)
    if split == "valid" and lenpen == STUDY_LENPEN and checkpoint == "best":
        # kept beside the study's test translations, as study.arms.kept_translations
        # reads them: output_length.py and significance.py then cover validation too
        (run_dir / "valid.hyp").write_text("".join(f"{line}\n" for line in hypotheses),
                                           encoding="utf-8")
    kept.parent.mkdir(exist_ok=True)
    kept.write_text(json.dumps(scores, indent=1))
    return scores


def study_test_bleu(run_dir, test_set):
    """The study's own test BLEU at lenpen 1.0, from its kept scores."""
    name = "test_scores.json" if test_set == CONVERGE_TEST_SETS[0] else f"{test_set}_scores.json"
    path = run_dir / name
    if not path.exists():
        raise SystemExit(f"length_penalty: {path} missing: the run has not been scored yet "
                         "(let the study finish it)")
    return json.loads(path.read_text())["bleu"]


def best_lenpen(valid_scores):
    """The grid's lenpen with the highest validation BLEU; the lower lenpen on a tie."""
    return max(sorted(valid_scores), key=lambda lenpen: (valid_scores[lenpen]["bleu"], -lenpen))


def screen_run(run_dir, sources, grid, checkpoint="best"):
    """One run's row: the validation screen, the chosen lenpen, test BLEU at
    both. The best checkpoint's test BLEU at 1.0 is the study's own; another
    checkpoint's is decoded here."""
    def decoded(split, lenpen):
        return decode_scores(run_dir, split, sources[split], lenpen, checkpoint)

    valid = {lenpen: decoded("valid", lenpen) for lenpen in grid}
    chosen = best_lenpen(valid)
    row = {"lenpen": chosen, "valid": valid, "test": {}}
    for test_set in CONVERGE_TEST_SETS:
        study = (study_test_bleu(run_dir, test_set) if checkpoint == "best"
                 else decoded(test_set, STUDY_LENPEN)["bleu"])
        tuned = study if chosen == STUDY_LENPEN else decoded(test_set, chosen)["bleu"]
        row["test"][test_set] = {"study": study, "tuned": tuned}
    return row


def markdown(title, rows, arms):
    """The per-run table, then per arm the tuning's change and the paired
    difference to arms[0] (mean ± standard error over seeds)."""
    first, second = CONVERGE_TEST_SETS[:2]
    lines = [f"### {title}", "",
             "| arm | seed | lenpen* | valid BLEU at 1.0 / lenpen* | valid length ratio at 1.0 / "
             f"lenpen* | {first} BLEU at 1.0 / lenpen* | {second} BLEU at 1.0 / lenpen* |",
             "|---|---|---|---|---|---|---|"]
    for arm in arms:
        for seed, row in sorted(rows.get(arm, {}).items()):
            at_one, tuned = row["valid"][STUDY_LENPEN], row["valid"][row["lenpen"]]
            tests = [row["test"][name] for name in (first, second)]
            lines.append(
                f"| {arm} | {seed} | {row['lenpen']:g} | {at_one['bleu']:.2f} / {tuned['bleu']:.2f} | "
                f"{at_one['length_ratio']:.3f} / {tuned['length_ratio']:.3f} | "
                + " | ".join(f"{t['study']:.2f} / {t['tuned']:.2f}" for t in tests) + " |")
    grid = sorted({lenpen for runs in rows.values() for row in runs.values() for lenpen in row["valid"]})
    lines += ["", "Validation BLEU (length ratio) at each lenpen:", "",
              "| arm | seed | " + " | ".join(f"{lenpen:g}" for lenpen in grid) + " |",
              "|---|---|" + "---|" * len(grid)]
    for arm in arms:
        for seed, row in sorted(rows.get(arm, {}).items()):
            cells = [f"{row['valid'][lp]['bleu']:.2f} ({row['valid'][lp]['length_ratio']:.3f})"
                     if lp in row["valid"] else "" for lp in grid]
            lines.append(f"| {arm} | {seed} | " + " | ".join(cells) + " |")
    lines += ["", f"Test BLEU, mean ± s.e. over seeds; differences paired by seed with {arms[0]}:", "",
              "| arm | test set | at 1.0 | at lenpen* | tuning's change | "
              f"− {arms[0]} at 1.0 | − {arms[0]} at lenpen* |", "|---|---|---|---|---|---|---|"]
    reference = rows.get(arms[0], {})
    for arm in arms:
        seeds = sorted(rows.get(arm, {}))
        for name in (first, second):
            study = [rows[arm][s]["test"][name]["study"] for s in seeds]
            tuned = [rows[arm][s]["test"][name]["tuned"] for s in seeds]
            change = [t - u for t, u in zip(tuned, study)]
            paired = [s for s in seeds if s in reference]
            cells = [mean_stderr(study).format(2, count=False), mean_stderr(tuned).format(2, count=False),
                     mean_stderr(change).signed(2)]
            for key in ("study", "tuned"):
                diffs = [rows[arm][s]["test"][name][key] - reference[s]["test"][name][key] for s in paired]
                cells.append(mean_stderr(diffs).signed(2) if arm != arms[0] and diffs else "")
            lines.append(f"| {arm} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("setting", type=Path, metavar="WORK/PAIR/SETTING",
                        help="a study setting folder, e.g. /work/study/de-en/paper-converge")
    parser.add_argument("--arms", nargs="+", required=True,
                        help="the arms' folder names; differences are to the first")
    parser.add_argument("--seeds", nargs="+", type=int, required=True)
    parser.add_argument("--grid", nargs="+", type=float, default=list(GRID),
                        help=f"the lenpens screened on validation (default: {' '.join(map(str, GRID))})")
    parser.add_argument("--checkpoint", choices=("best", "last"), default="best",
                        help="decode each run's checkpoint_best.pt (default) or its "
                             "checkpoint_last.pt (the end of its budget: is a BLEU difference "
                             "the best checkpoint's alone?)")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    if STUDY_LENPEN not in args.grid:
        raise SystemExit(f"length_penalty: the grid must hold the study's lenpen {STUDY_LENPEN} "
                         "(the table compares against it)")
    target = pair_target(args.setting.parent.name, "length_penalty")
    sources = split_sources(args.setting.parent, target)
    rows = {}
    for arm in args.arms:
        for seed in args.seeds:
            run_dir = args.setting / arm / f"seed{seed}"
            checkpoint = run_dir / f"checkpoint_{args.checkpoint}.pt"
            if not checkpoint.exists():
                raise SystemExit(f"length_penalty: no {checkpoint} (the study keeps it while "
                                 "its work folder lasts)")
            rows.setdefault(arm, {})[seed] = screen_run(run_dir, sources, args.grid,
                                                        args.checkpoint)
    text = markdown(f"{args.setting.parent.name} {args.setting.name}"
                    f"{checkpoint_label(args.checkpoint)}: length penalty tuned on validation",
                    rows, args.arms)
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
