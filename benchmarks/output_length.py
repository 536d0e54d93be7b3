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
is length and the part that is the words. ``--words N`` says where the
length goes: per test set, the N tokens (13a) whose count in the outputs
differs most between an arm and ``--baseline`` (stock), beside the
references' count, then the length split into the tokens beyond the
references' counts and the references' tokens not produced.

    .venv/bin/python benchmarks/output_length.py /work/study/de-en_n3000/short-converge \\
        /work/study/fr-en_n3000/short-converge --out benchmarks/results/x.md
"""

import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from fairseq_natbias.analysis import AnalysisError  # noqa: E402
from fairseq_natbias.analysis.distinct import tokenize  # noqa: E402  (sacreBLEU's 13a)
from fairseq_natbias.analysis.quality import bleu_score  # noqa: E402
from fairseq_natbias.analysis.stats import mean_stderr  # noqa: E402
# The study that kept the translations, and where it keeps them.
from study.arms import kept_translations, kept_translations_parser, print_and_write  # noqa: E402

PROGRAM = "output_length"  # names the script in its refusals


# --by-reference-length: the groups, by the reference's length in 13a tokens
# (inclusive; None: no upper end). Multi30k's English references fall into
# them as 18 / 54 / 22 / 7 % (test_2016_flickr, longer) and 40 / 42 / 13 / 5 %
# (test_2017_flickr).
REFERENCE_LENGTHS = ((1, 9), (10, 14), (15, 19), (20, None))


def corpus_bleu(hypotheses, references):
    """sacreBLEU's corpus BLEU score (its defaults, the study's signature),
    line by line; the measures below read their parts from it."""
    try:
        return bleu_score(hypotheses, references)[0]
    except AnalysisError as error:
        raise SystemExit(f"output_length: {error}") from None


def length_ratio(score):
    """c / r: the hypotheses' total 13a-token length over the references',
    as sacreBLEU's BLEU counts them for its brevity penalty."""
    return score.sys_len / score.ref_len


def brevity_penalty(score):
    """BLEU's BP = min(1, exp(1 - r / c))."""
    return score.bp


def bleu_without_brevity_penalty(score):
    """BLEU / BP: the geometric mean of the 1- to 4-gram precisions, x 100
    (0 for empty outputs, whose BP is 0 too)."""
    return score.score / score.bp if score.bp else 0.0


# The tables, each a measure of a corpus BLEU score: (column heading,
# measure, decimals); --brevity-penalty adds the last two to the first.
MEASURES = {"length": ("length ratio (hyp/ref)", length_ratio, 3),
            "brevity": ("brevity penalty (BP)", brevity_penalty, 4),
            "precision": ("BLEU / BP (the n-gram precisions)", bleu_without_brevity_penalty, 2)}


def read_setting(setting_dir):
    """Every kept translation under one study setting folder, read once for
    all the tables: ``[(arm, seed, test set, hypotheses, references)]``."""
    return list(kept_translations(setting_dir, PROGRAM))


def setting_scores(translations, by_reference_length=False):
    """``{arm: {test set: {seed: corpus BLEU score}}}`` of :func:`read_setting`'s
    ``translations``, each scored once for all :data:`MEASURES`;
    ``by_reference_length`` adds, after each test set, one entry per group of
    :data:`REFERENCE_LENGTHS` (named with its range and sentence count)."""
    found = {}
    for arm, seed, name, hypotheses, references in translations:
        groups = {name: (hypotheses, references)}
        if by_reference_length:
            groups.update(reference_length_groups(name, hypotheses, references))
        for group, (group_hypotheses, group_references) in groups.items():
            found.setdefault(arm, {}).setdefault(group, {})[seed] = corpus_bleu(
                group_hypotheses, group_references)
    return found


def reference_length_groups(name, hypotheses, references):
    """``{"<name>, references LO-HI tokens (n = N)": (hypotheses, references)}``
    for each non-empty group of :data:`REFERENCE_LENGTHS`, in their order."""
    if len(hypotheses) != len(references):
        corpus_bleu(hypotheses, references)  # refuses, naming both counts
    lengths = [len(tokenize(reference)) for reference in references]
    groups = {}
    for low, high in REFERENCE_LENGTHS:
        pairs = [(h, r) for h, r, n in zip(hypotheses, references, lengths)
                 if low <= n <= (high or float("inf"))]
        if pairs:
            span = f"{low}–{high}" if high else f"{low} or more"
            groups[f"{name}, references {span} tokens (n = {len(pairs)})"] = (
                [h for h, _ in pairs], [r for _, r in pairs])
    return groups


def markdown(title, scores, measure="length"):
    """One table of one of :data:`MEASURES`: arm, test set (in the order
    found: each set, then its reference-length groups), mean ± s.e. over
    seeds, and every seed's value."""
    heading, of_score, decimals = MEASURES[measure]
    lines = [f"### {title}", "",
             f"| arm | test set | {heading} | per seed |", "|---|---|---|---|"]
    for arm in sorted(scores):
        for test_set in scores[arm]:
            seeds = {seed: of_score(score) for seed, score in scores[arm][test_set].items()}
            summary = mean_stderr(list(seeds.values())).format(decimals, count=False)
            each = " / ".join(f"{seeds[s]:.{decimals}f} (seed {s})" for s in sorted(seeds))
            lines.append(f"| {arm} | {test_set} | {summary} | {each} |")
    return "\n".join(lines) + "\n"


def setting_word_counts(translations):
    """``({arm: {test set: {seed: Counter of 13a tokens}}}, {test set:
    Counter of the references' 13a tokens})`` of :func:`read_setting`'s
    ``translations``, for --words; each test set's references counted once."""
    outputs, references = {}, {}
    for arm, seed, name, hypotheses, reference_lines in translations:
        outputs.setdefault(arm, {}).setdefault(name, {})[seed] = word_counts(hypotheses)
        if name not in references:
            references[name] = word_counts(reference_lines)
    return outputs, references


def word_counts(lines):
    return Counter(token for line in lines for token in tokenize(line))


def length(counts, reference):
    return sum(counts.values())


def surplus(counts, reference):
    return sum(max(0, count - reference[token]) for token, count in counts.items())


def missing(counts, reference):
    return sum(max(0, count - counts[token]) for token, count in reference.items())


# --words' last rows: c - r = surplus - missing, over the whole test set
WORD_TOTALS = (("all tokens: the length", length),
               ("surplus: beyond the reference's counts", surplus),
               ("missing: the reference's, not produced", missing))


def words_markdown(title, outputs, references, baseline, top):
    """Where the length goes: per test set, the ``top`` 13a tokens whose
    count (mean over seeds) differs most between any arm and ``baseline``,
    beside the references' count; then every token together, the length
    split as c - r = surplus - missing over the token types t (c_t, r_t the
    outputs' and references' counts over the test set):

        surplus = sum_t max(0, c_t - r_t)   tokens beyond the reference's count
        missing = sum_t max(0, r_t - c_t)   reference tokens the outputs lack
    """
    if baseline not in outputs:
        raise SystemExit(f"output_length: --baseline {baseline!r} is not an arm here; "
                         f"the arms: {', '.join(sorted(outputs))}")
    others = sorted(arm for arm in outputs if arm != baseline)
    tables = []
    for test_set, reference in references.items():
        arms = [arm for arm in [baseline, *others] if test_set in outputs[arm]]
        seeds = {arm: list(outputs[arm][test_set].values()) for arm in arms}
        mean = {arm: mean_counts(seeds[arm]) for arm in arms}

        def spread(token):  # the largest difference of any arm to the baseline
            return max([abs(mean[arm][token] - mean[baseline][token]) for arm in arms[1:]] or [0])

        listed = sorted(set().union(*mean.values()), key=lambda token: (-spread(token), token))[:top]
        head = " | ".join([baseline] + [f"{arm} (− {baseline})" for arm in arms[1:]])
        lines = [f"### {title}: {test_set}, the {top} tokens whose counts differ most", "",
                 f"| token | reference | {head} |", "|---|" + "---|" * (len(arms) + 1)]
        for token in listed:
            lines.append(f"| `{token}` | {reference[token]:,} | "
                         + count_cells({arm: mean[arm][token] for arm in arms}, arms) + " |")
        for label, total in WORD_TOTALS:
            per_arm = {arm: sum(total(counts, reference) for counts in seeds[arm]) / len(seeds[arm])
                       for arm in arms}
            lines.append(f"| {label} | {total(reference, reference):,} | "
                         + count_cells(per_arm, arms) + " |")
        tables.append("\n".join(lines) + "\n")
    return "\n".join(tables)


def mean_counts(counters):
    total = Counter()
    for counts in counters:
        total.update(counts)
    return Counter({token: count / len(counters) for token, count in total.items()})


def count_cells(values, arms):
    """``values[arm]`` of the baseline (the first arm), then of each further
    arm with its difference to the baseline's."""
    base = values[arms[0]]
    return " | ".join([count_text(base)] + [
        f"{count_text(values[arm])} ({count_text(values[arm] - base, sign=True)})"
        for arm in arms[1:]])


def count_text(value, sign=False):
    """A count as a whole number, or with one decimal where it is a mean over seeds."""
    decimals = 0 if float(value).is_integer() else 1
    return f"{value:{'+' if sign else ''},.{decimals}f}"


def main(argv=None):
    parser = kept_translations_parser(__doc__, "WORK/de-en_n3000/short-converge")
    parser.add_argument("--by-reference-length", action="store_true",
                        help="also the ratio within groups of sentences by reference length")
    parser.add_argument("--brevity-penalty", action="store_true",
                        help="also tables of BLEU's brevity penalty and of BLEU / it")
    parser.add_argument("--words", type=int, metavar="N",
                        help="also the N tokens whose counts differ most from --baseline's")
    parser.add_argument("--baseline", default="stock",
                        help="the arm --words compares the others with (default: stock)")
    args = parser.parse_args(argv)
    if args.words is not None and args.words < 1:
        parser.error("--words takes a number of tokens, 1 or more")
    measures = list(MEASURES) if args.brevity_penalty else ["length"]
    tables = []
    for setting in args.settings:
        translations = read_setting(setting)
        scores = setting_scores(translations, args.by_reference_length)
        title = f"{setting.parent.name} {setting.name}"
        for measure in measures:
            tables.append(markdown(title if measure == "length" else
                                   f"{title}: {MEASURES[measure][0]}", scores, measure))
        if args.words:
            tables.append(words_markdown(title, *setting_word_counts(translations),
                                         args.baseline, args.words))
    print_and_write(tables, args.out)


if __name__ == "__main__":
    main()
