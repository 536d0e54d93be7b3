"""One call that gives a transformers model the natural bias, and one that
loads such a model back.

    model = MarianMTModel(config)                      # transformers' own, fresh
    model = add_natural_bias(model, train_dataset)     # b = log p of its labels, gain 0.05
    ...                                                # Trainer / Seq2SeqTrainer as usual
    model.save_pretrained(path)
    model = natbias.hf.from_pretrained(path)           # or AutoModelForSeq2SeqLM

The new model holds every parameter of the one given (the same random
init, so a run with and one without the natural bias differ in the output
layer alone) plus b, counted and smoothed as the fairseq plugin does
(:mod:`natbias.counts`, :mod:`natbias.prior`), and the gain g on W phi
(:mod:`natbias.projection`).
"""

from collections.abc import Iterable, Sequence
from typing import Optional

import numpy as np
import torch
from transformers import AutoConfig

from natbias import FORMAT_VERSION, __version__
from natbias.counts import check_counts, count_ids, read_counts_file
from natbias.errors import NaturalBiasError
from natbias.hf.models import (
    NATURAL_BIAS_CLASSES,
    SETTINGS,
    NaturalBiasModel,
    natural_bias_class,
    natural_bias_settings,
)
from natbias.prior import DEFAULT_SMOOTHING, log_unigram
from natbias.projection import DEFAULT_GAIN_INIT, DEFAULT_GAIN_SPEED, check_gain


def count_targets(targets, vocab_size: int, causal: bool = False) -> np.ndarray:
    """Counts of the tokens a model is trained to predict, from a tokenised
    dataset (its ``labels`` column, else ``input_ids``) or an iterable of
    token-id sequences. ``causal``: each sequence's first token is never a
    target (a decoder predicts token t + 1 from tokens 1..t). -100 is skipped."""
    column = None
    names = getattr(targets, "column_names", None)
    if names is not None:
        column = "labels" if "labels" in names else "input_ids"
        if column not in names:
            raise NaturalBiasError(
                f"the dataset has no 'labels' or 'input_ids' column "
                f"(it has {names}): tokenise it first"
            )
    sequences = _sequences(targets, column)
    if causal:
        sequences = (sequence[1:] for sequence in sequences)
    return check_counts(count_ids(sequences, vocab_size), "the training targets")


def _sequences(targets, column):
    if column is None:
        yield from targets
        return
    for batch in targets.iter(batch_size=1024):
        yield from batch[column]


def add_natural_bias(
    model,
    targets: Optional[Iterable[Sequence[int]]] = None,
    *,
    counts: Optional[Sequence[int]] = None,
    counts_file: Optional[str] = None,
    vocabulary=None,
    smoothing: float = DEFAULT_SMOOTHING,
    gain: bool = True,
    gain_init: float = DEFAULT_GAIN_INIT,
    gain_speed: float = DEFAULT_GAIN_SPEED,
) -> NaturalBiasModel:
    """``model`` with the natural bias: a new model of its natural-bias class
    (:data:`natbias.hf.models.NATURAL_BIAS_CLASSES`) holding its parameters.

    The prior comes from exactly one of ``targets`` (a tokenised dataset or
    token-id sequences: :func:`count_targets`), ``counts`` (one per vocabulary
    entry) or ``counts_file`` (written by ``natbias-count``; ``vocabulary``,
    the tokenizer, maps its symbols to ids). ``gain=False`` leaves W phi as
    it is (g = 1) instead of starting it at ``gain_init``."""
    natbias_class = natural_bias_class(model)
    vocab_size = model.get_output_embeddings().weight.shape[0]
    counts = _prior_counts(
        model, natbias_class, vocab_size, targets, counts, counts_file, vocabulary
    )
    log_prior = log_unigram(counts, smoothing)
    if gain:
        check_gain(gain_init, gain_speed)
    config = model.config.to_dict()
    config.pop("model_type", None)
    config[SETTINGS] = {
        "format_version": FORMAT_VERSION,
        "written_by": f"natbias {__version__}",
        "smoothing": float(smoothing),
        "prior_tokens": int(counts.sum()),
        "gain_init": float(gain_init) if gain else None,
        "gain_speed": float(gain_speed) if gain else None,
    }
    with torch.random.fork_rng(devices=[]):  # the new model's random init is thrown away
        natbias_model = natbias_class(natbias_class.config_class(**config))
    missing, unexpected = natbias_model.load_state_dict(model.state_dict(), strict=False)
    new_keys = {"natbias_log_prior", "lm_head.gain_param", "lm_head.bias"}
    if unexpected or set(missing) - new_keys:
        raise NaturalBiasError(
            f"{type(model).__name__}'s parameters do not fit its natural-bias "
            f"class: missing {sorted(set(missing) - new_keys)}, unexpected "
            f"{sorted(unexpected)}"
        )
    with torch.no_grad():
        natbias_model.output_bias().copy_(log_prior)
        natbias_model.natbias_log_prior.copy_(log_prior)
    parameter = next(model.parameters())
    natbias_model.to(parameter.device)
    natbias_model.train(model.training)
    return natbias_model


def _prior_counts(model, natbias_class, vocab_size, targets, counts, counts_file, vocabulary):
    given = [
        name
        for name, value in (("targets", targets), ("counts", counts), ("counts_file", counts_file))
        if value is not None
    ]
    if len(given) != 1:
        raise NaturalBiasError(
            "give the prior as exactly one of targets (a tokenised dataset or "
            "token-id lists), counts or counts_file; got "
            f"{', '.join(given) or 'none'}"
        )
    if targets is not None:
        causal = not getattr(model.config, "is_encoder_decoder", False)
        return count_targets(targets, vocab_size, causal)
    if counts_file is not None:
        if vocabulary is None:
            raise NaturalBiasError(
                "a counts file needs vocabulary= (the tokenizer) to map its "
                "symbols to the model's ids"
            )
        symbols = vocabulary.convert_ids_to_tokens(list(range(vocab_size)))
        return read_counts_file(counts_file, symbols)
    counts = np.asarray(counts, dtype=np.int64)
    if counts.shape != (vocab_size,):
        raise NaturalBiasError(
            f"{counts.shape[0] if counts.ndim else 0} counts for an output "
            f"layer of {vocab_size}: give one count per vocabulary entry"
        )
    return check_counts(counts, "the counts")


def from_pretrained(path: str, **kwargs) -> NaturalBiasModel:
    """Load a model saved with ``save_pretrained``, with its natural bias, as
    transformers' ``from_pretrained`` does (``kwargs`` go to it); a folder
    without the natural bias is refused, naming the fix."""
    config = AutoConfig.from_pretrained(path)
    natural_bias_settings(config)
    for natbias_class, _ in NATURAL_BIAS_CLASSES.values():
        if isinstance(config, natbias_class.config_class):
            return natbias_class.from_pretrained(path, **kwargs)
    raise NaturalBiasError(f"{path}: no natural-bias model class for {type(config).__name__}")
