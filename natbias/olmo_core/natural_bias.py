"""One call that gives an OLMo-core ``Transformer`` the natural bias, in place.

    model = TransformerConfig.olmo2_30M(vocab_size=...).build(init_device="meta")
    add_natural_bias(model, dataset)        # b = log p of the dataset's targets, g small
    train_module = train_module_config.build(model)   # parallelised, then init_weights
    ...                                     # OLMo-core's Trainer as usual

The head's linear map ``lm_head.w_out`` becomes a
:class:`natbias.projection.NaturalBiasProjection` around the same weight
Parameter: logits ``g W phi + b``, b the smoothed log-unigram
(:func:`natbias.prior.log_unigram`) of the tokens OLMo-core trains the model
to predict (:func:`count_targets`), the gain g starting at the core's 0.05.
Ids the tokenizer never produces (the vocabulary padded to a multiple of
128) count 0 and get add-alpha's finite floor, never -inf. A head built
with OLMo-core's ``fused_linear`` loss reads W and b without calling its
linear map: there g scales the head's input h instead (a hook on the
head's norm, :func:`natbias.olmo_core._compat.scale_head_input`), the
same ``W (g h) + b`` without the logits.

The model's class becomes its natural-bias subclass, which puts b and g back
after OLMo-core's ``init_weights`` (whose ``init_final_w_out`` zeroes every
head bias) and keeps the one-entry gain whole on every process under
tensor parallelism (ColwiseParallel would split it by the vocabulary).
Add the natural bias before the train module shards the model; a model
built on the meta device takes it there, and gets its values in
``init_weights``.
"""

import os
from collections.abc import Sequence
from typing import Optional

import numpy as np
import torch
from torch import nn

from natbias.counts import check_counts, count_ids, count_token_files, is_by_id, read_counts_file
from natbias.errors import NaturalBiasError
from natbias.head_config import HeadConfig, checked_counts, one_prior_source
from natbias.olmo_core import _compat
from natbias.projection import NaturalBiasProjection
from natbias.sharding import is_dtensor
from natbias.subclasses import natural_bias_subclass


def count_targets(dataset, vocab_size: int, *, cache: bool = True, cache_dir=None) -> np.ndarray:
    """Counts (one per id of the model's ``vocab_size``) of the tokens OLMo-core
    trains on ``dataset`` to predict: every token of every instance but its
    first (``olmo_core.data.utils.get_labels`` shifts the ids left), from the
    files as the dataset reads them (a mixture's share of each file, the
    remainder that fills no instance left out). ``dataset``: a built numpy
    dataset or its config (``NumpyFSLDatasetConfig``, ...); a dataset whose
    instances are not plain chunks (label masks, instance filters, padded
    or packed documents) is counted instance by instance, through
    ``get_labels``.

    The token files are split across the ranks of an initialised process
    group, and the counts kept in the dataset's ``work_dir`` (or
    ``cache_dir``; ``cache=False``: never) for the next start
    (:mod:`natbias.counts.corpus`)."""
    if isinstance(dataset, _compat.NumpyDatasetConfig):
        dataset = dataset.build()
    if not isinstance(dataset, _compat.NumpyDatasetBase):
        raise NaturalBiasError(
            f"natbias.olmo_core counts an OLMo-core numpy dataset or its config, not a "
            f"{type(dataset).__name__}: give counts= for anything else"
        )
    if dataset.vocab_size > vocab_size:
        raise NaturalBiasError(
            f"the dataset's tokenizer has {dataset.vocab_size} ids, the model's output layer "
            f"{vocab_size}: the counts are from another tokenizer than the model's"
        )
    where = "the token files"
    if _compat.is_chunked(dataset):
        quiet = cache_dir is None  # the default folder: no warning where it is read-only
        if cache_dir is None and getattr(dataset, "work_dir_set", False):
            cache_dir = dataset.work_dir
        length = dataset.sequence_length
        instances = [end - start for start, end in dataset.offsets]
        counts = count_token_files(
            dataset.paths, dataset.dtype, vocab_size, instance_length=length,
            lengths=[n * length for n in instances], tokenizer_size=dataset.vocab_size,
            cache=cache, cache_dir=cache_dir, quiet_cache=quiet,
        )  # fmt: skip
        return check_counts(counts, where)
    labels = (
        _compat.get_labels({k: torch.as_tensor(v)[None] for k, v in _tensors(dataset[i]).items()})
        for i in range(len(dataset))
    )
    return check_counts(count_ids(labels, vocab_size), where)


def _tensors(instance: dict) -> dict:
    return {k: v for k, v in instance.items() if isinstance(v, (torch.Tensor, np.ndarray))}


def add_natural_bias(
    model,
    dataset=None,
    *,
    counts: Optional[Sequence[int]] = None,
    counts_file: Optional[str] = None,
    smoothing: Optional[float] = None,
    gain: Optional[bool] = None,
    gain_init: Optional[float] = None,
    gain_speed: Optional[float] = None,
    cache: bool = True,
    cache_dir=None,
    config: Optional[HeadConfig] = None,
):
    """Gives the OLMo-core ``Transformer`` ``model`` the natural bias in place
    and returns it. The prior comes from exactly one of ``dataset`` (an
    OLMo-core numpy dataset or its config: :func:`count_targets`), ``counts``
    (one per id of the model's output layer) and ``counts_file`` (natbias-count's,
    by id). The head's settings are ``config``
    (:class:`natbias.head_config.HeadConfig`) or the keywords: ``gain=False``
    leaves W phi as it is (g = 1); otherwise g starts at ``gain_init``
    (the core's 0.05 by default). The dataset is counted across the ranks of
    an initialised process group and its counts kept for the next start
    (``cache``, ``cache_dir``: :func:`count_targets`)."""
    config = HeadConfig.of(config, smoothing=smoothing, gain=gain, gain_init=gain_init,
                           gain_speed=gain_speed)  # fmt: skip
    head, linear = check_model(model)
    vocab_size = linear.weight.shape[0]
    one_prior_source(dataset=dataset, counts=counts, counts_file=counts_file)
    if counts_file is not None:
        if os.path.isfile(counts_file) and not is_by_id(counts_file):
            raise NaturalBiasError(
                f"{counts_file} is keyed by symbols: make it by id, with natbias-count "
                "--tokens (or --hf-dataset)"
            )
        counts = read_counts_file(counts_file, range(vocab_size))
    if dataset is not None:
        counts = count_targets(dataset, vocab_size, cache=cache, cache_dir=cache_dir)
    counts = checked_counts(counts, vocab_size)
    projection = config.build(linear.weight, counts)
    if config.gain and _compat.uses_fused_loss(head):
        # The fused-linear loss reads W and b and never calls the projection:
        # g scales its input h instead, the same logits W (g h) + b (eq. 1
        # with the gain) without materialising them.
        projection.input_scaled_by_caller = True
        _compat.scale_head_input(head, projection.scale_by_gain)
    projection.natbias_counts = counts  # for the export to natbias.hf (natbias.olmo_core.export)
    _compat.set_head_linear(model, projection)
    model.__class__ = natural_bias_class(type(model))
    return model


def check_model(model):
    """The model's head and its linear map, where the natural bias can be
    added; anything else refused in one line saying why."""
    name = type(model).__name__
    if isinstance(model, NaturalBiasModel):
        raise NaturalBiasError(f"this {name} has the natural bias already")
    if not isinstance(model, _compat.Transformer):
        raise NaturalBiasError(f"natbias.olmo_core takes an OLMo-core Transformer, not a {name}")
    head, linear = _compat.head_of(model)
    if head is None:
        raise NaturalBiasError(f"this {name} has no LM head (a pipeline stage without it?)")
    if type(head) is not _compat.LMHead or type(linear) is not nn.Linear:
        raise NaturalBiasError(
            f"the {type(head).__name__}'s output is not the linear map W phi + b of the "
            "default LMHead: the natural bias is its b"
        )
    if getattr(model, "tie_word_embeddings", False):
        raise NaturalBiasError(
            "this model ties its LM head to the embeddings, which OLMo-core refuses with a "
            "head bias: build it with tie_word_embeddings=False"
        )
    if any(is_dtensor(p) for p in model.parameters()) or getattr(model, "tp_enabled", False):
        raise NaturalBiasError(
            "this model is sharded already: add the natural bias before the train module "
            "parallelises it (build on the meta device, add_natural_bias, then build the "
            "train module)"
        )
    return head, linear


class NaturalBiasModel:
    """The part of a natural-bias model that OLMo-core's own methods need."""

    @property
    def natbias_head(self) -> NaturalBiasProjection:
        return _compat.head_of(self)[1]

    @property
    def natbias_log_prior(self) -> torch.Tensor:
        return self.natbias_head.natbias_log_prior

    def init_weights(self, *args, **kwargs):
        """OLMo-core's, then b and the gain again: its ``init_final_w_out``
        zeroes the head's bias."""
        generator = super().init_weights(*args, **kwargs)
        self.natbias_head.reset_parameters()
        return generator

    def apply_tp(self, tp_mesh, *args, **kwargs):
        """OLMo-core's, with the gain whole on every process."""
        super().apply_tp(tp_mesh, *args, **kwargs)
        head = self.natbias_head
        if getattr(head, "gain_param", None) is not None and is_dtensor(head.gain_param):
            from torch.distributed.tensor import DTensor, Replicate

            whole = head.gain_param.full_tensor().detach()
            head.gain_param = nn.Parameter(
                DTensor.from_local(whole, tp_mesh, [Replicate()], run_check=False)
            )


def natural_bias_class(stock: type) -> type:
    """The natural-bias subclass of an OLMo-core model class (made once)."""
    return (
        stock
        if issubclass(stock, NaturalBiasModel)
        else natural_bias_subclass(stock, NaturalBiasModel)
    )
