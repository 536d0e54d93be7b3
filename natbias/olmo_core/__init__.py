"""The natural bias in AI2's OLMo-core (``pip install "fairseq-natbias[olmo]"``,
ai2-olmo-core 3.0.x: :mod:`natbias.olmo_core._compat`).

``add_natural_bias(model, dataset)``  any OLMo-core Transformer, in place: b = log p of the dataset's targets, and the gain
``count_targets(dataset, vocab_size)`` the counts, from OLMo-core's numpy token files as its datasets read them
``NaturalBiasCallback``               the bias statistics in the trainer's metrics; b for a stock head with a bias
``to_hf(model, output_dir)``          the model as a natbias.hf (transformers) checkpoint, b and the gain as trained

docs/pretraining.md shows a run from scratch.
"""

from natbias.olmo_core._compat import VERSION
from natbias.olmo_core.callback import NaturalBiasCallback, statistics
from natbias.olmo_core.export import to_hf
from natbias.olmo_core.natural_bias import (
    NaturalBiasModel,
    add_natural_bias,
    count_targets,
    natural_bias_class,
)

__all__ = [
    "VERSION",
    "NaturalBiasCallback",
    "NaturalBiasModel",
    "add_natural_bias",
    "count_targets",
    "natural_bias_class",
    "statistics",
    "to_hf",
]
