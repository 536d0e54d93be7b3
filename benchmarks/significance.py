"""Is a test-BLEU difference more than the sentences that were drawn?
sacreBLEU's paired tests of a learning-efficiency study's kept translations
(issue 36: the 29,000-pair De->En test_2016 deficit).

Seeds measure how much a difference varies with training; they say nothing
about the test set, which every seed shares. Here, per test set and seed,
each arm's translations are tested against ``--baseline``'s (stock's) on
the same sentences, with sacreBLEU's own paired tests (its defaults, its
fixed seed, so a rerun prints the same):

- paired bootstrap resampling (Koehn, 2004): 1,000 resamples of the test
  sentences with replacement; p is the share of resamples whose absolute
  difference, centred on the resamples' mean, exceeds the observed one;
- approximate randomization (Riezler and Maxwell, 2005): 10,000 shuffles of
  which system produced each sentence's translation; p is the share of
  shuffles whose absolute difference exceeds the observed one.

Both add one to the count and to the trials (after MultEval, Clark et al.,
2011), and both count strictly larger differences only, so two identical
outputs would get the smallest p there is; they are not tested here ("–").

Printed as a Markdown table per setting (arm, test set, seed, BLEU, the
difference to the baseline, both p-values). Translations are read where the
study keeps them (``study.arms.kept_translations``)::

    .venv/bin/python benchmarks/significance.py /work/study/de-en/paper-converge \\
        --out benchmarks/results/significance_de-en_paper_seed3.md
"""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from fairseq_natbias.analysis.quality import bleu_score  # noqa: E402
from study.arms import kept_translations, kept_translations_parser, print_and_write  # noqa: E402

PROGRAM = "significance"  # names the script in its refusals
BOOTSTRAP_SAMPLES = 1000
RANDOMIZATION_TRIALS = 10000
# sacreBLEU's test types, with their trials and the key each one's p is kept under
TESTS = (("bs", BOOTSTRAP_SAMPLES), ("ar", RANDOMIZATION_TRIALS))
P_VALUES = {"bs": "p_bootstrap", "ar": "p_randomization"}


def paired_tests(baseline, systems, references):
    """``{name: {"bleu", "difference", "p_bootstrap", "p_randomization"}}``
    for every system in ``systems`` ({name: hypotheses}) against
    ``baseline`` (hypotheses), all translations of the same ``references``;
    a system identical to the baseline gets no p-values (None)."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    for name, hypotheses in {"the baseline": baseline, **systems}.items():
        if len(hypotheses) != len(references):
            raise SystemExit(f"{PROGRAM}: {name} has {len(hypotheses)} translations but there are "
                             f"{len(references)} references (was a decode cut short?)")
    differing = {name: hypotheses for name, hypotheses in systems.items() if hypotheses != baseline}
    found = {}
    for test, samples in TESTS if differing else ():
        _, results = PairedTest([("baseline", baseline), *differing.items()], {"BLEU": BLEU()},
                                [references], test_type=test, n_samples=samples)()
        base = results["BLEU"][0].score
        for name, result in zip(results["System"][1:], results["BLEU"][1:]):
            values = found.setdefault(name, {"bleu": result.score, "difference": result.score - base})
            values[P_VALUES[test]] = result.p_value
    for name in systems.keys() - differing.keys():
        found[name] = {"bleu": bleu_score(baseline, references)[0].score, "difference": 0.0,
                       "p_bootstrap": None, "p_randomization": None}
    return {name: found[name] for name in systems}


def setting_tests(setting_dir, baseline):
    """``[(arm, test set, seed, paired_tests' values)]`` of every kept
    translation under one study setting folder with ``baseline``'s of the
    same test set and seed; arms without one are refused by name."""
    runs = {}
    for arm, seed, test_set, hypotheses, references in kept_translations(setting_dir, PROGRAM):
        runs.setdefault((test_set, seed), ({}, references))[0][arm] = hypotheses
    rows = []
    for (test_set, seed), (by_arm, references) in runs.items():
        if baseline not in by_arm:
            raise SystemExit(f"{PROGRAM}: --baseline {baseline!r} has no translation of {test_set} "
                             f"for seed {seed} under {setting_dir}; the arms there: "
                             f"{', '.join(sorted(by_arm))}")
        others = {arm: lines for arm, lines in sorted(by_arm.items()) if arm != baseline}
        for arm, values in paired_tests(by_arm[baseline], others, references).items():
            rows.append((arm, test_set, seed, values))
    return rows


def markdown(title, baseline, rows):
    lines = [f"### {title}: each arm against {baseline}, paired over the test sentences", "",
             f"| arm | test set | seed | BLEU | − {baseline} | p, paired bootstrap "
             f"({BOOTSTRAP_SAMPLES:,}) | p, approximate randomization ({RANDOMIZATION_TRIALS:,}) |",
             "|---|---|---|---|---|---|---|"]
    for arm, test_set, seed, values in sorted(rows, key=lambda row: row[:3]):
        p_values = [f"{values[key]:.4f}" if values[key] is not None else "– (identical)"
                    for key in ("p_bootstrap", "p_randomization")]
        lines.append(f"| {arm} | {test_set} | {seed} | {values['bleu']:.2f} | "
                     f"{values['difference']:+.2f} | " + " | ".join(p_values) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = kept_translations_parser(__doc__, "WORK/de-en/paper-converge")
    parser.add_argument("--baseline", default="stock",
                        help="the arm every other is tested against (default: stock)")
    args = parser.parse_args(argv)
    tables = []
    for setting in args.settings:
        tables.append(markdown(f"{setting.parent.name} {setting.name}", args.baseline,
                               setting_tests(setting, args.baseline)))
    print_and_write(tables, args.out)


if __name__ == "__main__":
    main()
