"""Are the outputs shorter? Hypothesis/reference length of a learning-
efficiency study's kept translations (issue 36: the criterion's outputs).

The study keeps each run's beam-5 translations of the best checkpoint as
``WORK/<setting>/<arm>/seed<k>/<test set>.hyp`` (``test.hyp`` is
test_2016_flickr), and the detokenised references as
``WORK/text/test.raw.<tgt>`` and ``WORK/text-<test set>/test.raw.<tgt>``.
The length ratio is sacreBLEU's own, c / r in BLEU's brevity penalty

    BP = min(1, exp(1 - r / c)),

c and r the hypotheses' and references' total lengths in ``13a`` tokens:
below 1 the outputs are shorter than the references, and BLEU pays for it.
Printed as a Markdown table per setting: each arm's mean ± standard error
over seeds per test set, and the ratio of every seed. ``--by-reference-length``
adds, under each test set, the same ratio within groups of sentences by
their reference's length (13a tokens: 1-9, 10-14, 15-19, 20 or more): are
the outputs short everywhere, or on long sentences? ``--brevity-penalty``
adds two tables of what the length costs: BP itself, and BLEU / BP, the
geometric mean of the n-gram precisions (x 100) that BLEU multiplies by BP,
so that BLEU = BP x (BLEU / BP) splits a BLEU difference into the part that
is length and the part that is the words.

    .venv/bin/python benchmarks/output_length.py /work/study/de-en_n3000/short-converge \\
        /work/study/fr-en_n3000/short-converge --out benchmarks/results/x.md
"""

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from fairseq_natbias.analysis.stats import mean_stderr  # noqa: E402
from fairseq_natbias.data_fetch import read_lines  # noqa: E402
# The study that kept the translations: its test sets, the first decoded as
# ``test`` (the data-bin's own split), each further one under its own name.
from study.arms import CONVERGE_TEST_SETS, pair_target  # noqa: E402

# file stem -> (test set name, the references' folder under the pair's work folder)
TEST_SETS = {"test": (CONVERGE_TEST_SETS[0], "text"),
             **{name: (name, f"text-{name}") for name in CONVERGE_TEST_SETS[1:]}}


# --by-reference-length: the groups, by the reference's length in 13a tokens
# (inclusive; None: no upper end). Multi30k's English references fall into
# them as 18 / 54 / 22 / 7 % (test_2016_flickr, longer) and 40 / 42 / 13 / 5 %
# (test_2017_flickr).
REFERENCE_LENGTHS = ((1, 9), (10, 14), (15, 19), (20, None))


def corpus_bleu(hypotheses, references):
    """sacreBLEU's corpus BLEU (its defaults, the study's signature), line by line."""
    if len(hypotheses) != len(references):
        raise SystemExit(f"output_length: {len(hypotheses)} hypotheses but "
                         f"{len(references)} references (was a decode cut short?)")
    from sacrebleu.metrics import BLEU

    return BLEU().corpus_score(hypotheses, [references])


def length_ratio(hypotheses, references):
    """c / r: the hypotheses' total 13a-token length over the references',
    as sacreBLEU's BLEU counts them for its brevity penalty."""
    score = corpus_bleu(hypotheses, references)
    return score.sys_len / score.ref_len


def brevity_penalty(hypotheses, references):
    """BLEU's BP = min(1, exp(1 - r / c))."""
    return corpus_bleu(hypotheses, references).bp


def bleu_without_brevity_penalty(hypotheses, references):
    """BLEU / BP: the geometric mean of the 1- to 4-gram precisions, x 100
    (0 for empty outputs, whose BP is 0 too)."""
    score = corpus_bleu(hypotheses, references)
    return score.score / score.bp if score.bp else 0.0


# --brevity-penalty adds these tables: (column heading, measure, decimals)
MEASURES = {"length": ("length ratio (hyp/ref)", length_ratio, 3),
            "brevity": ("brevity penalty (BP)", brevity_penalty, 4),
            "precision": ("BLEU / BP (the n-gram precisions)", bleu_without_brevity_penalty, 2)}


def setting_values(setting_dir, by_reference_length=False, measure=length_ratio):
    """``{arm: {test set: {seed: value}}}``, ``measure(hypotheses,
    references)`` (the length ratio unless given) of every kept translation
    under one study setting folder (WORK/<setting>); ``by_reference_length`` adds,
    after each test set, one entry per group of :data:`REFERENCE_LENGTHS`
    (named with its range and sentence count)."""
    work, target = setting_dir.parent, pair_target(setting_dir.parent.name, "output_length")
    found = {}
    for hyp in sorted(setting_dir.glob("*/seed*/*.hyp")):
        if hyp.stem not in TEST_SETS:
            continue
        name, folder = TEST_SETS[hyp.stem]
        references = work / folder / f"test.raw.{target}"
        if not references.is_file():
            raise SystemExit(f"output_length: {hyp} has no references at {references} "
                             "(give the study's own WORK/<setting> folder)")
        seed = int(hyp.parent.name[len("seed"):])
        hypotheses, references = read_lines(hyp), read_lines(references)
        groups = {name: (hypotheses, references)}
        if by_reference_length:
            groups.update(reference_length_groups(name, hypotheses, references))
        arm = found.setdefault(hyp.parent.parent.name, {})
        for group, (group_hypotheses, group_references) in groups.items():
            arm.setdefault(group, {})[seed] = measure(group_hypotheses, group_references)
    return found


def reference_length_groups(name, hypotheses, references):
    """``{"<name>, references LO-HI tokens (n = N)": (hypotheses, references)}``
    for each non-empty group of :data:`REFERENCE_LENGTHS`, in their order."""
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    if len(hypotheses) != len(references):
        corpus_bleu(hypotheses, references)  # refuses, naming both counts
    tokenize = Tokenizer13a()
    groups = {}
    for low, high in REFERENCE_LENGTHS:
        pairs = [(h, r) for h, r in zip(hypotheses, references)
                 if low <= len(tokenize(r).split()) <= (high or float("inf"))]
        if pairs:
            span = f"{low}–{high}" if high else f"{low} or more"
            groups[f"{name}, references {span} tokens (n = {len(pairs)})"] = (
                [h for h, _ in pairs], [r for _, r in pairs])
    return groups


def markdown(title, values, heading=MEASURES["length"][0], decimals=3):
    """One table: arm, test set (in the order found: each set, then its
    reference-length groups), mean ± s.e. over seeds, and every seed's value."""
    lines = [f"### {title}", "",
             f"| arm | test set | {heading} | per seed |", "|---|---|---|---|"]
    for arm in sorted(values):
        for test_set in values[arm]:
            seeds = values[arm][test_set]
            summary = mean_stderr(list(seeds.values())).format(decimals, count=False)
            each = " / ".join(f"{seeds[s]:.{decimals}f} (seed {s})" for s in sorted(seeds))
            lines.append(f"| {arm} | {test_set} | {summary} | {each} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("settings", nargs="+", type=Path, metavar="WORK/PAIR/SETTING",
                        help="a study setting folder, e.g. WORK/de-en_n3000/short-converge")
    parser.add_argument("--by-reference-length", action="store_true",
                        help="also the ratio within groups of sentences by reference length")
    parser.add_argument("--brevity-penalty", action="store_true",
                        help="also tables of BLEU's brevity penalty and of BLEU / it")
    parser.add_argument("--out", type=Path, help="also write the tables here")
    args = parser.parse_args(argv)
    measures = list(MEASURES.values()) if args.brevity_penalty else [MEASURES["length"]]
    tables = []
    for setting in args.settings:
        if not setting.is_dir():
            raise SystemExit(f"output_length: no folder {setting}")
        for heading, measure, decimals in measures:
            values = setting_values(setting, args.by_reference_length, measure)
            if not values:
                raise SystemExit(f"output_length: no kept translations (*/seed*/*.hyp) "
                                 f"under {setting}")
            title = f"{setting.parent.name} {setting.name}"
            if measure is not length_ratio:
                title += f": {heading}"
            tables.append(markdown(title, values, heading, decimals))
    text = "\n".join(tables)
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
