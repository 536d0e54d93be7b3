"""Model log-probability of reference tokens against their training frequency
(Meister et al., 2023, sec. 4.2, Fig. 4).

"we plot a token's unigram log-frequency against the average log-probability
assigned to it (when it is the ground-truth token) by a model initialised with
(left) a bias term of 0 and (right) a log-unigram bias term, binning them in
equal-length intervals and averaging them for clarity. In Fig. 4b, the bias
terms are not added in the linear projection, i.e., only the contextual part of
eq. (4), p_Wphi(. | y_<t), is computed." Fig. 4's caption: "Probabilities in
upper row are computed using all model parameters; in the lower row, the bias
term is dropped from the final linear projection."

Here, for one checkpoint and one binarised split (default ``test``):

1. teacher-forced scoring through fairseq's own model and task loading: every
   reference token y_t (EOS included, padding not) gets
   ``log softmax(W phi + b)[y_t]`` (full) and ``log softmax(W phi)[y_t]``
   (bias dropped: the decoder's logits minus b);
2. per token type, the average of each over its occurrences;
3. x = the type's log-unigram probability in the training data: the counts of
   :mod:`fairseq_natbias.unigram` over the training split of the data
   directory, smoothed as the model was (``--natbias-smoothing``, default
   add-one) -- the same values as the model's ``target_log_unigram`` buffer;
   without a training split in the data directory, that buffer is used;
4. equal-width bins of x between the smallest and largest x of the types in
   the split (intervals [a, b), the last one closed); per bin, the unweighted
   mean over types of x and of both average log-probabilities.

All logarithms are natural. A model without an output bias (``--natbias-init
none``, or fairseq's own transformer) gives the same numbers in both rows.
"""

import glob
import logging
import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from fairseq_natbias import checkpoint_loading, unigram
from fairseq_natbias.analysis import AnalysisError, plots

logger = logging.getLogger(__name__)

DEFAULT_BINS = 20
NO_BIAS_NOTE = "no output bias: same as the full model"


@dataclass
class TokenScores:
    """Per target type: occurrences as the reference token and summed
    log-probabilities (full model, bias dropped), plus its log-unigram."""

    label: str
    symbols: List[str]
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
        return (self.log_unigram[keep], self.sum_full[keep] / n,
                self.sum_without_bias[keep] / n)


# --- loading a checkpoint through fairseq -----------------------------------------


def load_checkpoint(path: str, data: str, split: str, use_cuda: bool):
    """Model and task of ``path`` with its data directory replaced by ``data``,
    via fairseq's ``checkpoint_utils.load_model_ensemble_and_task``."""
    from fairseq import checkpoint_utils, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    state = checkpoint_loading.read_with_fairseq(path, {"data": data})
    cfg = state.get("cfg") or convert_namespace_to_omegaconf(state["args"])
    task = tasks.setup_task(cfg.task)
    check_dictionaries(state["model"], task, path, data)
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides={"data": data}, task=task, state=state)
    model = models[0].eval()
    if use_cuda:
        model.cuda()
    load_split(task, split)
    return model, task, cfg


def load_split(task, split) -> None:
    data = unigram.task_config(task).data
    # Checked before fairseq opens it: numpy cannot memory-map an empty .bin,
    # and fairseq's half-built dataset then fails again in its __del__.
    first_dir = str(data).split(":")[0]
    bins = glob.glob(os.path.join(first_dir, f"{split}.bin")) + glob.glob(os.path.join(first_dir, f"{split}.*.bin"))
    if any(os.path.getsize(path) == 0 for path in bins):
        raise AnalysisError(f"the {split} split of {data} is empty: nothing to score")
    try:
        task.load_dataset(split)
    except ValueError as error:
        raise AnalysisError(f"cannot read the {split} split of {data}: {error}") from None


def check_dictionaries(model_state, task, path, data) -> None:
    """The checkpoint's embedding tables must have one row per entry of the
    data directory's dictionaries."""
    pairs = (("encoder.embed_tokens.weight", task.source_dictionary, "source"),
             ("decoder.embed_tokens.weight", task.target_dictionary, "target"))
    for key, dictionary, side in pairs:
        if key in model_state and dictionary is not None:
            rows = model_state[key].shape[0]
            if rows != len(dictionary):
                raise AnalysisError(
                    f"mismatched dictionaries: {path} was trained with a {side} "
                    f"dictionary of {rows} entries, the {side} dictionary in {data} "
                    f"has {len(dictionary)}. Use the data directory the model was "
                    "trained on (its dict.*.txt files)."
                )


def output_bias(model) -> Optional[torch.Tensor]:
    projection = getattr(model.decoder, "output_projection", None)
    return None if projection is None else getattr(projection, "bias", None)


# --- x: the training log-unigram ----------------------------------------------------


def training_log_unigram(model, task, cfg) -> Tuple[np.ndarray, str]:
    """The smoothed log-unigram of the training targets, and where it came from."""
    data = unigram.task_config(task).data
    train_split = getattr(cfg.dataset, "train_subset", None) or "train"
    alpha = getattr(cfg.model, "natbias_smoothing", None) or 1.0
    try:
        counts = unigram.count_training_targets(task, train_split)
    except unigram.MissingTrainingSplit:  # e.g. only the test split was shipped
        counts = None
    if counts is not None:
        log_u = unigram.unigram_log_probs(counts, alpha).double().numpy()
        _compare_with_buffer(model, log_u)
        return log_u, f"counted in the {train_split} split of {data} (add-{alpha:g})"
    buffer = getattr(model, "target_log_unigram", None)
    if buffer is not None and bool(buffer.abs().sum() > 0):
        return buffer.double().cpu().numpy(), "the model's target_log_unigram buffer"
    raise AnalysisError(
        f"no {train_split} split in {data} to count the training unigram from, and "
        "the checkpoint has no target_log_unigram; use the model's training data "
        "directory"
    )


def _compare_with_buffer(model, log_u):
    buffer = getattr(model, "target_log_unigram", None)
    if buffer is None or not bool(buffer.abs().sum() > 0):
        return
    gap = float(np.max(np.abs(buffer.double().cpu().numpy() - log_u)))
    if gap > 1e-4:
        logger.warning(
            "the model's target_log_unigram differs from the unigram counted in the "
            "data directory (max |difference| %.3g): the checkpoint was trained on "
            "other data or with another dictionary", gap)


# --- y: teacher-forced scores ------------------------------------------------------------


def score_reference_tokens(model, task, split, max_tokens=4096, use_cuda=False,
                           progress: Optional[Callable[[str], None]] = None):
    """Occurrences and summed log-probabilities (full, bias dropped) per target type."""
    dataset = task.dataset(split)
    if len(dataset) == 0:
        raise AnalysisError(f"the {split} split of {unigram.task_config(task).data} is empty: nothing to score")
    vocab = len(task.target_dictionary)
    totals = [torch.zeros(vocab, dtype=torch.float64) for _ in range(3)]
    batches = reference_batches(model, task, dataset, max_tokens)
    done = 0
    with torch.no_grad():
        for i, sample in enumerate(batches, start=1):
            _check_token_ids(sample, task)
            if use_cuda:
                from fairseq import utils
                sample = utils.move_to_cuda(sample)
            for total, part in zip(totals, _score_batch(model, sample, vocab)):
                total += part.cpu()
            done += sample["nsentences"]
            if progress and (i % 50 == 0 or done == len(dataset)):
                progress(f"scored {done}/{len(dataset)} sentences")
    occurrences, sum_full, sum_without = (t.numpy() for t in totals)
    return occurrences.astype(np.int64), sum_full, sum_without, done


def reference_batches(model, task, dataset, max_tokens):
    """Every sentence of ``dataset`` once, in fairseq's length order, for
    teacher-forced scoring: no batch dropped for its size (fairseq issue
    #5036), none longer than the model takes."""
    from fairseq import utils

    return task.get_batch_iterator(
        dataset=dataset, max_tokens=max_tokens,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=True, required_batch_size_multiple=1, seed=1, num_workers=0,
    ).next_epoch_itr(shuffle=False)


def _check_token_ids(sample, task):
    for tokens, dictionary, side in (
        (sample["net_input"]["src_tokens"], task.source_dictionary, "source"),
        (sample["target"], task.target_dictionary, "target"),
    ):
        if tokens.numel() and int(tokens.max()) >= len(dictionary):
            raise AnalysisError(
                f"mismatched dictionaries: the binarised {side} side holds token id "
                f"{int(tokens.max())}, the {side} dictionary has {len(dictionary)} "
                "entries; the split was binarised with another dictionary"
            )


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


def score_checkpoint(label, path, data, split="test", max_tokens=4096, use_cuda=False,
                     progress=None) -> TokenScores:
    model, task, cfg = load_checkpoint(path, data, split, use_cuda)
    log_u, source = training_log_unigram(model, task, cfg)
    occurrences, sum_full, sum_without, sentences = score_reference_tokens(
        model, task, split, max_tokens, use_cuda, progress)
    dictionary = task.target_dictionary
    if label is None:
        label = getattr(cfg.model, "natbias_init", None) or os.path.basename(path)
    return TokenScores(
        label=label, symbols=[dictionary[i] for i in range(len(dictionary))],
        log_unigram=log_u, unigram_source=source, occurrences=occurrences,
        sum_full=sum_full, sum_without_bias=sum_without,
        has_bias=output_bias(model) is not None, sentences=sentences,
    )


# --- bins ---------------------------------------------------------------------------


def equal_width_edges(x_values: Sequence[np.ndarray], n_bins: int = DEFAULT_BINS) -> np.ndarray:
    """``n_bins`` equal-length intervals from the smallest to the largest x."""
    if n_bins < 1:
        raise AnalysisError("the number of bins must be at least 1")
    low = min(float(np.min(x)) for x in x_values)
    high = max(float(np.max(x)) for x in x_values)
    if high == low:  # every type equally frequent: one bin around it
        return np.array([low - 0.5, high + 0.5])
    return np.linspace(low, high, n_bins + 1)


def bin_index(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin of each x: intervals [a, b), the last one [a, b]."""
    index = np.searchsorted(edges, x, side="right") - 1
    return np.clip(index, 0, len(edges) - 2)


def bin_averages(scores: TokenScores, edges: np.ndarray) -> List[dict]:
    """One row per non-empty bin: type count, occurrences and mean x, mean
    average log-probability (full, bias dropped) over the types in it."""
    x, full, without = scores.averages()
    occurrences = scores.occurrences[scores.present]
    index = bin_index(x, edges)
    rows = []
    for b in range(len(edges) - 1):
        members = index == b
        if not members.any():
            continue
        rows.append({
            "model": scores.label, "bin": b, "bin_low": edges[b], "bin_high": edges[b + 1],
            "bin_center": (edges[b] + edges[b + 1]) / 2, "token_types": int(members.sum()),
            "occurrences": int(occurrences[members].sum()),
            "mean_log_unigram": float(x[members].mean()),
            "mean_logprob_full": float(full[members].mean()),
            "mean_logprob_without_bias": float(without[members].mean()),
        })
    return rows


# --- the whole analysis -------------------------------------------------------------


@dataclass
class FrequencyAnalysis:
    scores: List[TokenScores]
    edges: np.ndarray
    bins: Dict[str, List[dict]]


def analyse(checkpoints: Sequence[Tuple[Optional[str], str]], data: str, split: str = "test",
            n_bins: int = DEFAULT_BINS, max_tokens: int = 4096, use_cuda: bool = False,
            progress=None) -> FrequencyAnalysis:
    """``checkpoints``: ``(label, path)`` pairs, one column of Fig. 4 each; a
    None label becomes the model's ``--natbias-init``."""
    if not checkpoints:
        raise AnalysisError("no checkpoint to analyse")
    scores = []
    for label, path in checkpoints:
        if progress:
            progress(f"scoring the {split} split of {data} with {path}")
        scores.append(score_checkpoint(label, path, data, split, max_tokens, use_cuda, progress))
    labels = [s.label for s in scores]
    if len(set(labels)) != len(labels):
        raise AnalysisError(f"two models share a label ({', '.join(labels)}): "
                            "name them with LABEL=CHECKPOINT")
    edges = equal_width_edges([s.averages()[0] for s in scores], n_bins)
    return FrequencyAnalysis(scores, edges, {s.label: bin_averages(s, edges) for s in scores})


BIN_COLUMNS = ("model", "bin", "bin_low", "bin_high", "bin_center", "token_types",
               "occurrences", "mean_log_unigram", "mean_logprob_full",
               "mean_logprob_without_bias")
TOKEN_COLUMNS = ("model", "token_id", "symbol", "log_unigram", "occurrences",
                 "avg_logprob_full", "avg_logprob_without_bias")


def write_outputs(analysis: FrequencyAnalysis, out_dir: str) -> List[str]:
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
        for scores in analysis.scores:
            writer.writerows(_token_rows(scores))
    plot_path = plots.frequency_panels(_plot_columns(analysis), os.path.join(out_dir, "frequency.png"))
    return [bins_path, tokens_path, plot_path]


def _token_rows(scores: TokenScores):
    for token in np.flatnonzero(scores.present):
        n = scores.occurrences[token]
        yield (scores.label, int(token), scores.symbols[token], f"{scores.log_unigram[token]:.6f}",
               int(n), f"{scores.sum_full[token] / n:.6f}",
               f"{scores.sum_without_bias[token] / n:.6f}")


def _plot_columns(analysis):
    columns = []
    for scores in analysis.scores:
        rows = analysis.bins[scores.label]
        columns.append({
            "label": scores.label,
            "x": [r["bin_center"] for r in rows],
            "full": [r["mean_logprob_full"] for r in rows],
            "without_bias": [r["mean_logprob_without_bias"] for r in rows],
            "note": None if scores.has_bias else NO_BIAS_NOTE,
        })
    return columns
