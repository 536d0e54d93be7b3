"""Where a model's gain lies by training frequency: the console scripts
natbias-loss-by-frequency, natbias-frequency-bias and natbias-output-frequency
(docs/tools.md). The statistics are natbias.tools.by_frequency's and
natbias.tools.frequency_bias's (numpy only); the scoring is the engine's
(fairseq_natbias.scoring, natbias.hf.scoring), found through the
``natbias.scorers`` entry points (natbias.tools.cli.engine): this module
imports no engine, and a user of one engine needs not the other.
"""

import functools
import os
import sys
from collections import Counter

import numpy as np
from tqdm import tqdm

from natbias.counts import read_counts_by_symbol
from natbias.errors import NaturalBiasError
from natbias.tools import by_frequency, frequency_bias
from natbias.tools.by_frequency import DEFAULT_EDGES, DEFAULT_MIN_TOKENS, LN2
from natbias.tools.cli import (
    add_values_argument,
    engine,
    parser_for,
    print_written,
    progress_on_stderr,
    run_tool,
)
from natbias.tools.generate_output import parse_generate_output, read_text_lines


def add_bin_arguments(parser):
    add_values_argument(
        parser,
        "--edges",
        int,
        DEFAULT_EDGES,
        "COUNT",
        "the bins' inclusive lower bounds in training counts, increasing",
        nargs="*",
    )
    parser.add_argument(
        "--min-tokens",
        type=int,
        default=DEFAULT_MIN_TOKENS,
        help=f"bins with fewer reference tokens are marked 'few' (default {DEFAULT_MIN_TOKENS})",
    )


def add_model_arguments(parser):
    parser.add_argument("--data", help="fairseq: the data directory the models were trained on")
    parser.add_argument("--counts", help="transformers: training counts (natbias-count's format)")
    parser.add_argument("--train-text", help="transformers: the training text, to count")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even if CUDA is there")


def framework(paths, args) -> str:
    """``fairseq`` (checkpoint files, --data) or ``transformers`` (model folders)."""
    for path in paths:
        if not os.path.exists(path):
            raise NaturalBiasError(f"{path}: no such checkpoint file or model folder")
    kinds = {"fairseq" if os.path.isfile(p) else "transformers" for p in paths}
    if len(kinds) > 1:
        raise NaturalBiasError(
            f"{' and '.join(paths)}: give two fairseq checkpoints or two transformers folders"
        )
    kind = kinds.pop()
    if kind == "fairseq" and not args.data:
        raise NaturalBiasError("fairseq checkpoints need --data, their data directory")
    return kind


# --- natbias-loss-by-frequency ------------------------------------------------------

LOSS_PROG = "natbias-loss-by-frequency"
LOSS_DOC = f"""{LOSS_PROG}: each reference token's loss under two models, their
difference (MODEL - BASELINE, bits: negative where MODEL is better) grouped by
the token's count in the training targets; per bin its median (Pappas et al.,
2020, sec. 4.3 and Fig. 3), mean and token count; and each model's KL of its
average prediction from the training unigram, add-1 smoothed (Kobayashi et
al., 2023, sec. 3.1)::

    {LOSS_PROG} stock/checkpoint_best.pt unigram/checkpoint_best.pt \\
        --data data-bin --gen-subset test --out-dir by-frequency
    {LOSS_PROG} stock-lm/ natbias-lm/ --text test.en --train-text train.en --out-dir out

fairseq: translation or language-model checkpoints on one data directory
(the reference tokens: the split's targets). transformers: two causal LM
folders (model and tokenizer) and a text file, one sentence a line. Writes
loss_by_frequency.csv and loss_by_frequency.png (median per bin; hatched:
fewer than --min-tokens tokens).
"""


def loss_parser():
    parser = parser_for(LOSS_PROG, LOSS_DOC)
    parser.add_argument("baseline", help="the baseline: checkpoint file or model folder")
    parser.add_argument("model", help="the model compared with it")
    add_model_arguments(parser)
    parser.add_argument("--gen-subset", default="test", help="fairseq: split to score")
    parser.add_argument("--text", help="transformers: the text to score, one sentence a line")
    parser.add_argument("--max-tokens", type=int, default=4096, help="fairseq: tokens per batch")
    add_bin_arguments(parser)
    parser.add_argument("--out-dir", required=True, help="directory for the CSV and the plot")
    return parser


def run_loss(args):
    by_frequency.check_edges(args.edges)  # before any model is loaded
    progress = progress_on_stderr(LOSS_PROG)
    scorer = engine("scorers", framework([args.baseline, args.model], args))
    ids, lp_base, lp_model, counts, averages = scorer.score_pair(args, progress)
    rows = by_frequency.loss_difference_bins(
        ids, -lp_base / LN2, -lp_model / LN2, counts, args.edges, args.min_tokens
    )
    unigram = by_frequency.smoothed_unigram(counts)
    for name, path, lp, average in zip(
        ("baseline", "model"), (args.baseline, args.model), (lp_base, lp_model), averages
    ):
        kl = by_frequency.kl_bits(average, unigram)
        print(
            f"{name} {path}: {-lp.mean() / LN2:.4f} bits a token over {len(lp)} tokens; "
            f"KL(average prediction || training unigram) {kl:.4f} bits"
        )
    columns = ("bin", "tokens", "types", "median_difference_bits", "mean_difference_bits", "few")
    ylabel = "median loss difference (bits)\nmodel - baseline"
    paths = by_frequency.write_bins(
        rows, args.out_dir, "loss_by_frequency", "median_difference_bits", ylabel, 0.0
    )
    print_written(paths, by_frequency.markdown_table(rows, columns))
    return rows


loss_main = functools.partial(run_tool, LOSS_PROG, loss_parser, run_loss)


# --- natbias-frequency-bias -------------------------------------------------------

BIAS_PROG = "natbias-frequency-bias"
BIAS_DOC = f"""{BIAS_PROG}: a language model's BLiMP frequency bias ("Rare Word
Representation Learning by Smoothing Over Word Classes", sec. 4.1 and App. E):
minimal pairs that replace tokens, ranked by the relative difference of their
differing tokens' mean training counts; the BLiMP score of the lower and the
upper third; the bias, upper minus lower::

    {BIAS_PROG} blimp/data checkpoint_best.pt --data lm-bin --spm spm.model
    {BIAS_PROG} blimp/*.jsonl natbias-lm/ --counts train.counts --csv blimp.csv

PAIRS: BLiMP's JSON lines (sentence_good, sentence_bad), plain or gzipped, or a
folder holding them (BLiMP's data/: 67 files, one phenomenon each). The pairs of
all files are ranked together. Pairs that differ in token order only, or by
added tokens only, are counted and skipped (App. E). The differing tokens are
the multiset differences of the model's tokens (natbias/tools/frequency_bias.py
says why). --csv: one row a phenomenon (BLiMP's score over all its pairs, pairs
kept, its pairs in each third and their score) and a last row, all.
"""

# Sentences a call to the engine's scorer: the progress bar's step. The engine
# batches them further (padding, which a causal model never reads).
SCORE_CHUNK = 512


def bias_parser():
    parser = parser_for(BIAS_PROG, BIAS_DOC)
    parser.add_argument(
        "pairs", nargs="+", help="BLiMP's JSON lines file(s), plain or .gz, or a folder of them"
    )
    parser.add_argument("model", help="a fairseq LM checkpoint or a transformers causal LM folder")
    add_model_arguments(parser)
    parser.add_argument("--spm", help="fairseq: the SentencePiece model the data was encoded with")
    parser.add_argument("--out-dir", help="directory for frequency_bias.csv (one row a pair)")
    parser.add_argument("--csv", help="CSV file: one row a phenomenon, then all")
    return parser


def score_sentences(score, sentences, what):
    """Each sentence's log-probability: every distinct sentence scored once, in
    order of length (batches of like length, little padding), a progress bar
    over all sentences on stderr."""
    distinct = sorted(set(sentences), key=lambda ids: (len(ids), ids))
    times = Counter(sentences)
    scores = {}
    with tqdm(total=len(sentences), desc=what, unit=" sentences", file=sys.stderr) as bar:
        for start in range(0, len(distinct), SCORE_CHUNK):
            chunk = distinct[start : start + SCORE_CHUNK]
            scores.update(zip(chunk, score([list(ids) for ids in chunk])))
            bar.update(sum(times[ids] for ids in chunk))
    return [scores[ids] for ids in sentences]


def run_bias(args):
    files = frequency_bias.pair_files(args.pairs)
    pairs = [pair for path in files for pair in frequency_bias.read_pairs(path)]
    scorer = engine("scorers", framework([args.model], args))
    encode, score, counts = scorer.sentence_scorer(args)
    sentences = [tuple(ids) for ids in encode([text for p in pairs for text in (p.good, p.bad)])]
    tokens = list(zip(sentences[::2], sentences[1::2]))
    frequency_bias.check_pairs(tokens)
    what = f"{len(pairs)} pairs of {len(files)} phenomena"
    scored = iter(score_sentences(score, sentences, what))
    scores = [(next(scored), next(scored)) for _ in tokens]
    result = frequency_bias.frequency_bias(pairs, tokens, counts, scores)
    phenomena = frequency_bias.phenomenon_rows(pairs, scores, result)
    print(
        f"{len(result.rows)} replacement pairs of {len(pairs)}; "
        f"{frequency_bias.skipped_text(result.skipped)}\n"
        f"BLiMP score, all pairs (mean of {len(phenomena) - 1} phenomena): "
        f"{phenomena[-1]['blimp_score']:.4f}\nBLiMP score, all kept pairs: {result.score:.4f}\n"
        f"lower third ({result.third} pairs, bad sentence's tokens more frequent): "
        f"{result.lower_score:.4f}\nupper third ({result.third} pairs, good sentence's tokens "
        f"more frequent): {result.upper_score:.4f}\nfrequency bias (upper - lower): {result.bias:+.4f}"
    )
    written = [by_frequency.write_rows(phenomena, args.csv)] if args.csv else []
    if args.out_dir:
        path = os.path.join(args.out_dir, "frequency_bias.csv")
        written.append(by_frequency.write_rows(result.rows, path))
    print_written(written)
    result.phenomena = phenomena
    return result


bias_main = functools.partial(run_tool, BIAS_PROG, bias_parser, run_bias)


# --- natbias-output-frequency -----------------------------------------------------

OUTPUT_PROG = "natbias-output-frequency"
OUTPUT_DOC = f"""{OUTPUT_PROG}: how often a system's output uses the tokens of
each training-frequency bin, against the references: tokens produced / tokens
in the references per bin (above 1: over-generated)::

    {OUTPUT_PROG} generate-test.txt --counts train.counts --out-dir out
    {OUTPUT_PROG} --hypotheses hyp.txt --references ref.txt --train-text train.en --out-dir out

fairseq-generate output: its H- and T- lines (in the units --post-process
left; the training counts must be in the same units). Plain text: one
sentence a line in each file. Tokens are split at spaces. Training counts: a
counts file (natbias-count) or the training text (tokens split at spaces).
Tokens the counts lack count 0.
"""


def output_parser():
    parser = parser_for(OUTPUT_PROG, OUTPUT_DOC)
    parser.add_argument("generated", nargs="?", help="fairseq-generate output")
    parser.add_argument("--hypotheses", help="plain text: the system's output")
    parser.add_argument("--references", help="plain text: the references, line by line")
    parser.add_argument("--counts", help="training counts (natbias-count's format)")
    parser.add_argument("--train-text", help="the training targets as text")
    add_bin_arguments(parser)
    parser.add_argument("--out-dir", required=True, help="directory for the CSV and the plot")
    return parser


def read_system_output(args):
    """(hypotheses, references), one string a sentence."""
    if args.generated:
        generated = parse_generate_output(
            read_text_lines(args.generated, "fairseq-generate output")
        )
        kept = [
            s for s in generated.values() if s.hypothesis is not None and s.reference is not None
        ]
        if not kept:
            raise NaturalBiasError(
                f"{args.generated} has no H- and T- lines (fairseq-generate output)"
            )
        return [s.hypothesis for s in kept], [s.reference for s in kept]
    if not (args.hypotheses and args.references):
        raise NaturalBiasError("give fairseq-generate output, or --hypotheses and --references")
    hypotheses = read_text_lines(args.hypotheses, "text, one sentence a line")
    references = read_text_lines(args.references, "text, one sentence a line")
    if len(hypotheses) != len(references):
        raise NaturalBiasError(
            f"{len(hypotheses)} hypotheses, {len(references)} references: give one of each a line"
        )
    return hypotheses, references


def run_output(args):
    by_frequency.check_edges(args.edges)
    if (args.counts is None) == (args.train_text is None):
        raise NaturalBiasError("give the training counts: --counts FILE or --train-text FILE")
    hypotheses, references = read_system_output(args)
    if args.counts:
        train = Counter(read_counts_by_symbol(args.counts))
    else:
        lines = read_text_lines(args.train_text, "the training text")
        train = Counter(token for line in lines for token in line.split())
    produced = Counter(token for line in hypotheses for token in line.split())
    reference = Counter(token for line in references for token in line.split())
    types = sorted(set(produced) | set(reference))
    rows = by_frequency.output_frequency_bins(
        np.array([produced[t] for t in types]),
        np.array([reference[t] for t in types]),
        np.array([train[t] for t in types]),
        args.edges,
        args.min_tokens,
    )
    print(
        f"{sum(produced.values())} tokens produced, {sum(reference.values())} in the "
        f"references, {len(hypotheses)} sentences"
    )
    ylabel = "tokens produced /\ntokens in the references"
    paths = by_frequency.write_bins(rows, args.out_dir, "output_frequency", "ratio", ylabel, 1.0)
    print_written(
        paths, by_frequency.markdown_table(rows, ("bin", "produced", "reference", "ratio", "few"))
    )
    return rows


output_main = functools.partial(run_tool, OUTPUT_PROG, output_parser, run_output)
