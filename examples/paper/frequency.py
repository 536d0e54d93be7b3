"""The paper's Fig. 4: the average log-probability of each reference token
against its log-unigram probability in the training data, binned into
equal-length intervals, with the full model and with the output bias dropped
(Meister et al., 2023)::

    python examples/paper/frequency.py data-bin/iwslt14.de-en \\
        --model zero=runs/iwslt/zero/seed1/checkpoint_best.pt \\
        --model unigram=runs/iwslt/unigram/seed1/checkpoint_best.pt \\
        --out-dir analysis/fig4

Per target type of one binarised split: the average teacher-forced
``log softmax(W phi + b)[y]`` (all parameters) and ``log softmax(W phi)[y]``
(bias dropped: the contextual part of eq. 4), against the type's smoothed
log-unigram in the training split (the model's ``target_log_unigram`` without
one), averaged over types in equal-width bins of x ([a, b), the last closed).
Natural logarithms throughout.

Given a zero and a unigram model, frequency.png has the four panels of Fig. 4
(columns: models; upper row: all parameters; lower row: bias dropped). Also
written: frequency_bins.csv (a row per non-empty bin and model) and
frequency_tokens.csv (a row per token type in the split).
"""

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from fairseq_natbias import scoring, training_data
from fairseq_natbias.scoring import load_checkpoint
from natbias.errors import NaturalBiasError
from natbias.prior import DEFAULT_SMOOTHING, log_unigram
from natbias.tools import plots
from natbias.tools.cli import parser_for, print_written, progress_on_stderr, run_tool

logger = logging.getLogger(__name__)

DEFAULT_BINS = 20
NO_BIAS_NOTE = "no output bias: same as the full model"


@dataclass
class TokenScores:
    """Per target type: occurrences as the reference token, summed
    log-probabilities (full model, bias dropped) and its log-unigram."""

    label: str
    symbols: list[str]
    log_unigram: np.ndarray
    unigram_source: str
    occurrences: np.ndarray
    sum_full: np.ndarray
    sum_without_bias: np.ndarray
    has_bias: bool
    sentences: int

    @property
    def present(self) -> np.ndarray:
        return self.occurrences > 0

    def averages(self):
        """``(x, avg full, avg without bias)`` over the types in the split."""
        keep = self.present
        n = self.occurrences[keep]
        return (self.log_unigram[keep], self.sum_full[keep] / n, self.sum_without_bias[keep] / n)


def output_bias(model) -> Optional[torch.Tensor]:
    projection = getattr(model.decoder, "output_projection", None)
    return None if projection is None else getattr(projection, "bias", None)


def training_log_unigram(model, task, cfg) -> tuple[np.ndarray, str]:
    """The smoothed log-unigram of the training targets, and where it came from."""
    data = training_data.task_config(task).data
    train_split = getattr(cfg.dataset, "train_subset", None) or "train"
    alpha = getattr(cfg.model, "natbias_smoothing", None) or DEFAULT_SMOOTHING
    buffer = getattr(model, "target_log_unigram", None)
    if buffer is not None and not bool(buffer.abs().sum() > 0):
        buffer = None
    try:
        counts = training_data.count_training_targets(task, train_split)
    except training_data.MissingTrainingSplit:  # e.g. only the test split was shipped
        counts = None
    if counts is not None:
        log_u = log_unigram(counts, alpha).double().numpy()
        gap = (
            0.0 if buffer is None else float(np.max(np.abs(buffer.double().cpu().numpy() - log_u)))
        )
        if gap > 1e-4:
            logger.warning(
                "the model's target_log_unigram differs from the unigram counted in the "
                "data directory (max |difference| %.3g): the checkpoint was trained on "
                "other data or with another dictionary",
                gap,
            )
        return log_u, f"counted in the {train_split} split of {data} (add-{alpha:g})"
    if buffer is not None:
        return buffer.double().cpu().numpy(), "the model's target_log_unigram buffer"
    raise NaturalBiasError(
        f"no {train_split} split in {data} to count the training unigram from, and "
        "the checkpoint has no target_log_unigram; use the model's training data "
        "directory"
    )


def score_reference_tokens(
    model,
    task,
    split,
    max_tokens=4096,
    use_cuda=False,
    progress: Optional[Callable[[str], None]] = None,
):
    """Occurrences and summed log-probabilities (full, bias dropped) per target type."""
    from fairseq import utils

    dataset = task.dataset(split)
    vocab = len(task.target_dictionary)
    totals = [torch.zeros(vocab, dtype=torch.float64) for _ in range(3)]
    batches = scoring.batches(model, task, split, max_tokens)
    done = 0
    with torch.no_grad():
        for i, sample in enumerate(batches, start=1):
            scoring.check_token_ids(sample, task)
            if use_cuda:
                sample = utils.move_to_cuda(sample)
            for total, part in zip(totals, _score_batch(model, sample, vocab)):
                total += part.cpu()
            done += sample["nsentences"]
            if progress and (i % 50 == 0 or done == len(dataset)):
                progress(f"scored {done}/{len(dataset)} sentences")
    occurrences, sum_full, sum_without = (t.numpy() for t in totals)
    return occurrences.astype(np.int64), sum_full, sum_without, done


def _score_batch(model, sample, vocab):
    """Per-type occurrences and sums of the reference tokens' log-probabilities."""
    net_output = model(**sample["net_input"])
    full = model.get_normalized_probs(net_output, log_probs=True)
    bias = output_bias(model)
    if bias is None:
        without = full
    else:
        contextual = (net_output[0] - bias.to(net_output[0].dtype), *net_output[1:])
        without = model.get_normalized_probs(contextual, log_probs=True)
    target = sample["target"]
    mask = target.ne(model.decoder.padding_idx)
    tokens = target[mask]

    def summed(lprobs):
        picked = lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)[mask].double()
        return torch.bincount(tokens, weights=picked, minlength=vocab)

    occurrences = torch.bincount(tokens, minlength=vocab).double()
    return occurrences, summed(full), summed(without)


def score_checkpoint(
    label, path, data, split="test", max_tokens=4096, use_cuda=False, progress=None
) -> TokenScores:
    model, task, cfg = load_checkpoint(path, data, split, use_cuda)
    log_u, source = training_log_unigram(model, task, cfg)
    occurrences, sum_full, sum_without, sentences = score_reference_tokens(
        model, task, split, max_tokens, use_cuda, progress
    )
    dictionary = task.target_dictionary
    if label is None:
        label = getattr(cfg.model, "natbias_init", None) or os.path.basename(path)
    return TokenScores(
        label=label,
        symbols=[dictionary[i] for i in range(len(dictionary))],
        log_unigram=log_u,
        unigram_source=source,
        occurrences=occurrences,
        sum_full=sum_full,
        sum_without_bias=sum_without,
        has_bias=output_bias(model) is not None,
        sentences=sentences,
    )


def equal_width_edges(x_values: Sequence[np.ndarray], n_bins: int = DEFAULT_BINS) -> np.ndarray:
    """``n_bins`` equal-length intervals from the smallest to the largest x."""
    if n_bins < 1:
        raise NaturalBiasError("the number of bins must be at least 1")
    low = min(float(np.min(x)) for x in x_values)
    high = max(float(np.max(x)) for x in x_values)
    if high == low:  # every type equally frequent: one bin around it
        return np.array([low - 0.5, high + 0.5])
    return np.linspace(low, high, n_bins + 1)


def bin_averages(scores: TokenScores, edges: np.ndarray) -> list[dict]:
    """One row per non-empty bin: type count, occurrences, mean x and mean
    average log-probabilities (full, bias dropped) over its types."""
    x, full, without = scores.averages()
    occurrences = scores.occurrences[scores.present]
    # intervals [a, b), the last one [a, b]
    index = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)
    rows = []
    for b in range(len(edges) - 1):
        members = index == b
        if not members.any():
            continue
        rows.append(
            {
                "model": scores.label,
                "bin": b,
                "bin_low": edges[b],
                "bin_high": edges[b + 1],
                "bin_center": (edges[b] + edges[b + 1]) / 2,
                "token_types": int(members.sum()),
                "occurrences": int(occurrences[members].sum()),
                "mean_log_unigram": float(x[members].mean()),
                "mean_logprob_full": float(full[members].mean()),
                "mean_logprob_without_bias": float(without[members].mean()),
            }
        )
    return rows


@dataclass
class FrequencyAnalysis:
    scores: list[TokenScores]
    edges: np.ndarray
    bins: dict[str, list[dict]]


def analyse(
    checkpoints: Sequence[tuple[Optional[str], str]],
    data: str,
    split: str = "test",
    n_bins: int = DEFAULT_BINS,
    max_tokens: int = 4096,
    use_cuda: bool = False,
    progress=None,
) -> FrequencyAnalysis:
    """``checkpoints``: ``(label, path)`` pairs, one column of Fig. 4 each; a
    None label becomes the model's ``--natbias-init``."""
    if not checkpoints:
        raise NaturalBiasError("no checkpoint to analyse")
    scores = []
    for label, path in checkpoints:
        if progress:
            progress(f"scoring the {split} split of {data} with {path}")
        scores.append(score_checkpoint(label, path, data, split, max_tokens, use_cuda, progress))
    labels = [s.label for s in scores]
    if len(set(labels)) != len(labels):
        raise NaturalBiasError(
            f"two models share a label ({', '.join(labels)}): name them with LABEL=CHECKPOINT"
        )
    edges = equal_width_edges([s.averages()[0] for s in scores], n_bins)
    return FrequencyAnalysis(scores, edges, {s.label: bin_averages(s, edges) for s in scores})


BIN_COLUMNS = (
    "model",
    "bin",
    "bin_low",
    "bin_high",
    "bin_center",
    "token_types",
    "occurrences",
    "mean_log_unigram",
    "mean_logprob_full",
    "mean_logprob_without_bias",
)
TOKEN_COLUMNS = (
    "model",
    "token_id",
    "symbol",
    "log_unigram",
    "occurrences",
    "avg_logprob_full",
    "avg_logprob_without_bias",
)


def write_outputs(analysis: FrequencyAnalysis, out_dir: str) -> list[str]:
    """frequency_bins.csv, frequency_tokens.csv and frequency.png in ``out_dir``."""
    import csv

    os.makedirs(out_dir, exist_ok=True)
    bins_path = os.path.join(out_dir, "frequency_bins.csv")
    with open(bins_path, "w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=BIN_COLUMNS)
        writer.writeheader()
        for rows in analysis.bins.values():
            writer.writerows(rows)
    tokens_path = os.path.join(out_dir, "frequency_tokens.csv")
    with open(tokens_path, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(TOKEN_COLUMNS)
        for s in analysis.scores:
            for token in np.flatnonzero(s.present):
                n = s.occurrences[token]
                writer.writerow(
                    (
                        s.label,
                        int(token),
                        s.symbols[token],
                        f"{s.log_unigram[token]:.6f}",
                        int(n),
                        f"{s.sum_full[token] / n:.6f}",
                        f"{s.sum_without_bias[token] / n:.6f}",
                    )
                )
    columns = [
        {
            "label": s.label,
            "x": [r["bin_center"] for r in analysis.bins[s.label]],
            "full": [r["mean_logprob_full"] for r in analysis.bins[s.label]],
            "without_bias": [r["mean_logprob_without_bias"] for r in analysis.bins[s.label]],
            "note": None if s.has_bias else NO_BIAS_NOTE,
        }
        for s in analysis.scores
    ]
    plot_path = frequency_panels(columns, os.path.join(out_dir, "frequency.png"))
    return [bins_path, tokens_path, plot_path]


def frequency_panels(columns: list[dict], path: str) -> str:
    """``columns = [{"label", "x", "full", "without_bias", "note"}, ...]``: upper row
    with all parameters, lower row without the output bias (Fig. 4)."""
    fig, axes = plots.grid(columns, path, rows=2, sharey="row")
    rows = (("full", "all parameters"), ("without_bias", "bias dropped (W phi only)"))
    for col, column in enumerate(columns):
        for row, (key, row_title) in enumerate(rows):
            ax = axes[row][col]
            ax.plot(column["x"], column[key], "o-", color=plots.color_of(col), markersize=4)
            if row == 1 and column.get("note"):
                row_title = column["note"]
            ax.set_title(f"{column['label']}: {row_title}", fontsize="medium")
            ax.set_xlabel("log unigram probability (training data)")
            if col == 0:
                ax.set_ylabel("avg. log-probability of reference token")
    return plots.save(fig, path)


PROG = "examples/paper/frequency.py"


def build_parser():
    parser = parser_for(PROG, __doc__)
    parser.add_argument("data", help="fairseq data directory the models were trained on")
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="[LABEL=]CHECKPOINT",
        help="a checkpoint, optionally labelled (repeat: one column each; "
        "default label: the model's --natbias-init)",
    )
    parser.add_argument("--gen-subset", default="test", help="split to score (default: test)")
    parser.add_argument(
        "--bins",
        type=int,
        default=DEFAULT_BINS,
        help=f"equal-length intervals of log-unigram (default {DEFAULT_BINS})",
    )
    parser.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch")
    parser.add_argument("--cpu", action="store_true", help="score on the CPU even if CUDA is there")
    parser.add_argument(
        "--user-dir",
        help="another fairseq plugin the checkpoint needs (this package is loaded already)",
    )
    parser.add_argument("--out-dir", required=True, help="directory for the CSVs and frequency.png")
    return parser


def run(args):
    import torch

    if args.user_dir:
        from argparse import Namespace

        from fairseq import utils

        from fairseq_natbias.in_process import this_copy

        try:
            utils.import_user_module(Namespace(user_dir=this_copy(args.user_dir)))
        except ImportError as error:
            raise NaturalBiasError(f"--user-dir {args.user_dir}: {error}") from error
    use_cuda = torch.cuda.is_available() and not args.cpu
    checkpoints = [
        (label, path) if sep else (None, spec)
        for spec in args.model
        for label, sep, path in [spec.partition("=")]
    ]
    analysis = analyse(
        checkpoints,
        args.data,
        args.gen_subset,
        args.bins,
        args.max_tokens,
        use_cuda,
        progress=progress_on_stderr(PROG),
    )
    for scores in analysis.scores:
        print(
            f"{scores.label}: {scores.sentences} sentences, "
            f"{int(scores.occurrences.sum())} reference tokens of "
            f"{int(scores.present.sum())} types; unigram {scores.unigram_source}"
        )
        if not scores.has_bias:
            print(
                f"{scores.label}: the model has no output bias, so the bias-dropped "
                "row equals the full model"
            )
    print_written(write_outputs(analysis, args.out_dir))
    return analysis


def main(argv=None):
    run_tool(PROG, build_parser, run, argv)


if __name__ == "__main__":
    main()
