"""One call that gives a transformers generator the natural bias, in place,
and one that loads such a model back.

    model = AutoModelForCausalLM.from_config(config)   # transformers' own, fresh
    add_natural_bias(model, train_dataset)             # now b = log p of its labels, g small
    ...                                                # Trainer / Seq2SeqTrainer as usual
    model.save_pretrained(path)
    model = natbias.hf.from_pretrained(path)           # or the Auto classes

The model keeps every parameter it had (the same objects: a run with and one
without the natural bias differ in the output layer alone) and gains b,
counted and smoothed as the fairseq plugin does, and the gain g on W phi. Any
generator whose head is a linear map takes it; one that maps the head's
output (a scale, a soft cap) gets the b that starts it at the unigram all the
same (:mod:`natbias.hf.logit_map`).
"""

import dataclasses
from collections.abc import Sequence
from typing import Optional

import numpy as np
from torch import nn
from transformers import AutoConfig, PreTrainedModel

from natbias.counts import check_counts, count_dataset, count_ids, is_by_id, read_counts_file
from natbias.errors import NaturalBiasError
from natbias.head_config import HeadConfig, checked_counts, one_prior_source
from natbias.hf._compat import model_class
from natbias.hf.gain_start import contextual_scale, initial_gain
from natbias.hf.logit_map import check_starts_at_prior, initial_bias, measure_logit_map
from natbias.hf.models import (
    FINAL_LOGITS_BIAS,
    SETTINGS,
    NaturalBiasModel,
    natural_bias_class,
    natural_bias_settings,
    set_class,
)
from natbias.hf.registry import GENERATOR_AUTO_CLASSES, register
from natbias.hf.sharded import is_sharded
from natbias.hf.targets import target_column, target_sequences
from natbias.prior import log_unigram
from natbias.subclasses import stock_name


def count_targets(
    targets, vocab_size: int, causal: bool = False, *, cache: bool = True, cache_dir=None
) -> np.ndarray:
    """Counts of the tokens a model is trained to predict, from what a
    Trainer is given as its dataset (:mod:`natbias.hf.targets`: a 🤗 dataset,
    a list or torch dataset of dicts, token-id sequences); each example's
    ``labels``, else its ``input_ids``. ``causal``: each sequence's first
    token is never a target (a decoder predicts token t + 1 from tokens
    1..t). -100 is skipped.

    A 🤗 dataset is read as Arrow arrays, split across the ranks of an
    initialised process group, and its counts kept beside its cache files
    (or in ``cache_dir``; ``cache=False``: never) for the next start
    (:mod:`natbias.counts.corpus`)."""
    column = target_column(targets)
    if column is not None:
        counts = count_dataset(targets, vocab_size, column, causal=causal, cache=cache,
                               cache_dir=cache_dir)  # fmt: skip
        return check_counts(counts, "the training targets")
    sequences = target_sequences(targets)
    if causal:
        sequences = (sequence[1:] for sequence in sequences)
    return check_counts(count_ids(sequences, vocab_size), "the training targets")


def add_natural_bias(
    model,
    targets=None,
    *,
    counts: Optional[Sequence[int]] = None,
    counts_file: Optional[str] = None,
    vocabulary=None,
    smoothing: Optional[float] = None,
    gain: Optional[bool] = None,
    gain_init: Optional[float] = None,
    gain_speed: Optional[float] = None,
    cache: bool = True,
    cache_dir: Optional[str] = None,
    config: Optional[HeadConfig] = None,
) -> NaturalBiasModel:
    """Gives ``model`` the natural bias in place and returns it, now of its
    natural-bias class (:func:`natbias.hf.models.natural_bias_class`): every
    parameter it had is kept, not copied; b, the gain and the prior are added.

    The prior comes from exactly one of ``targets`` (the tokenised dataset
    the Trainer is given, or token-id sequences: :func:`count_targets`), ``counts`` (one per vocabulary
    entry) or ``counts_file`` (written by ``natbias-count``; ``vocabulary``,
    the tokenizer, maps its symbols to ids). The head's settings are
    ``config`` (:class:`natbias.head_config.HeadConfig`) or the keywords
    (alpha 1, the gain on, C 20): ``gain=False`` leaves W phi as it is (g =
    1) instead of starting it at ``gain_init``; without one, the start is
    0.05, lowered where the model's W phi is large enough to take it from the
    unigram (:mod:`natbias.hf.gain_start`). A 🤗 dataset is counted
    across the ranks of an initialised process group and its counts kept for
    the next start (``cache``, ``cache_dir``: :func:`count_targets`)."""
    config = HeadConfig.of(config, smoothing=smoothing, gain=gain, gain_init=gain_init,
                           gain_speed=gain_speed)  # fmt: skip
    name = check_generator(model)
    vocab_size = model.get_output_embeddings().weight.shape[0]
    counts = _prior_counts(model, vocab_size, targets, counts, counts_file, vocabulary,
                           {"cache": cache, "cache_dir": cache_dir})  # fmt: skip
    log_prior = log_unigram(counts, config.smoothing)
    logit_map = measure_logit_map(model, name)
    if config.gain and config.gain_init is None:
        start = initial_gain(contextual_scale(model, logit_map))
        config = dataclasses.replace(config, gain_init=start)
    bias = initial_bias(log_prior, logit_map, name)
    settings = config.saved(counts.sum())
    if logit_map:
        settings["logit_map"] = logit_map
    natbias_class = natural_bias_class(type(model))
    undo = _InPlace(model)
    try:
        set_class(model, natbias_class, natbias_class.config_class)
        model.config.architectures = [natbias_class.__name__]
        setattr(model.config, SETTINGS, settings)
        model._install_natural_bias(settings, bias, log_prior)
        check_starts_at_prior(model, bias, log_prior, name)
    except BaseException:
        undo()
        raise
    register(natbias_class)
    return model


def check_generator(model) -> str:
    """The class name of a model that can take the natural bias; any other
    is refused in one line saying why."""
    name = type(model).__name__
    if isinstance(model, NaturalBiasModel):
        raise NaturalBiasError(f"{name} has the natural bias already")
    if not isinstance(model, PreTrainedModel):
        raise NaturalBiasError(f"natbias.hf takes a transformers PreTrainedModel, not a {name}")
    head = model.get_output_embeddings()
    if head is None:
        raise NaturalBiasError(
            f"{name} has no output layer (get_output_embeddings() is None): give "
            "the natural bias to its language-model class (...ForCausalLM, "
            "...ForConditionalGeneration)"
        )
    if not isinstance(head, nn.Linear) or type(head).forward is not nn.Linear.forward:
        raise NaturalBiasError(
            f"{name}'s output layer is a {type(head).__name__}, not a linear map "
            "W phi: the natural bias is the b of logits W phi + b"
        )
    if is_sharded(model):
        raise NaturalBiasError(
            f"{name} is sharded already: add the natural bias before sharding (build the "
            "model, on the meta device if it is large; add_natural_bias; then fully_shard "
            "or tp_plan; then to_empty and init_weights)"
        )
    if not model.can_generate():
        raise NaturalBiasError(
            f"{name} is not a generator (a causal or sequence-to-sequence language "
            "model): the natural bias is the unigram of what a generator predicts"
        )
    return name


class _InPlace:
    """Puts back what add_natural_bias changes, should it fail half-way."""

    def __init__(self, model):
        self.model, self.model_class = model, type(model)
        self.config_class, self.config = type(model.config), dict(model.config.__dict__)
        self.head = model.get_output_embeddings()
        self.buffers = dict(model._buffers)

    def __call__(self):
        model = self.model
        for name in ("natbias_slot", "natbias_logit_map", "natbias_initial_values"):
            model.__dict__.pop(name, None)
        set_class(model, self.model_class, self.config_class)
        model.config.__dict__.clear()
        model.config.__dict__.update(self.config)
        model._parameters.pop(FINAL_LOGITS_BIAS, None)
        model._buffers.clear()
        model._buffers.update(self.buffers)
        model.set_output_embeddings(self.head)


def _prior_counts(model, vocab_size, targets, counts, counts_file, vocabulary, caching):
    one_prior_source(targets=targets, counts=counts, counts_file=counts_file)
    if targets is not None:
        causal = not getattr(model.config, "is_encoder_decoder", False)
        return count_targets(targets, vocab_size, causal, **caching)
    if counts_file is not None:
        if is_by_id(counts_file):
            return read_counts_file(counts_file, range(vocab_size))
        if vocabulary is None:
            raise NaturalBiasError(
                "a counts file of symbols needs vocabulary= (the tokenizer) to map them "
                "to the model's ids"
            )
        symbols = vocabulary.convert_ids_to_tokens(list(range(vocab_size)))
        return read_counts_file(counts_file, symbols)
    return checked_counts(counts, vocab_size)


def from_pretrained(path: str, **kwargs) -> NaturalBiasModel:
    """Load a model saved with ``save_pretrained``, with its natural bias, as
    transformers' ``from_pretrained`` does (``kwargs`` go to it); a folder
    without the natural bias is refused, naming the fix."""
    config = AutoConfig.from_pretrained(path)
    natural_bias_settings(config)
    return _saved_class(config, path).from_pretrained(path, **kwargs)


def _saved_class(config, path) -> type:
    """The class the configuration names (``architectures``), else the one
    the Auto classes map it to."""
    import transformers

    for name in getattr(config, "architectures", None) or ():
        stock = getattr(transformers, stock_name(name) or "", None)
        if isinstance(stock, type) and issubclass(stock, PreTrainedModel):
            return natural_bias_class(stock)
    for auto_class in GENERATOR_AUTO_CLASSES:
        made = model_class(auto_class, config)
        if made is not None:
            return made
    raise NaturalBiasError(f"{path}: no natural-bias model class for {type(config).__name__}")
