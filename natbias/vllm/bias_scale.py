"""lambda * b per request in vLLM: the logits ``g W phi + lambda b`` of
:class:`natbias.hf.BiasScaleLogitsProcessor` (Kobayashi et al., 2023,
"Transformer Language Models Handle Word Frequency in Prediction Head"),
as a vLLM logits processor that each request turns on by its own lambda::

    SamplingParams(temperature=0, extra_args={"natbias_bias_scale": 0.5})
    {"prompt": ..., "vllm_xargs": {"natbias_bias_scale": 0.5}}     # the OpenAI server

It is installed with natbias (the ``vllm.logits_processors`` entry point), so
every vLLM engine in natbias's environment has it; a request without the
argument is left as it is. The shift ``(lambda - 1) f(b)`` is that of the
transformers processor: b as the logits see it (f, the family's soft cap or
scale: :func:`natbias.hf.logit_map.map_bias`), in float32, read from the
saved model's own files.
"""

import glob
import math
import os

import torch

from natbias import head
from natbias.errors import NaturalBiasError
from natbias.hf.logit_map import map_bias
from natbias.vllm.models import BIAS

try:
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
    from vllm.v1.sample.logits_processor.builtin import process_dict_updates
except ImportError as error:  # not an ImportError of natbias's: vLLM's environment only
    raise ImportError("natbias.vllm.bias_scale runs inside vLLM: pip install vllm") from error

ARGUMENT = "natbias_bias_scale"


def requested_scale(params) -> float | None:
    """The lambda a request asks for (None: none), checked."""
    value = (getattr(params, "extra_args", None) or {}).get(ARGUMENT)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(
            f"{ARGUMENT} must be a finite number (lambda in g W phi + lambda b), got {value!r}"
        )
    return float(value)


def saved_bias(model_config) -> torch.Tensor | None:
    """f(b) in float32 of a natural-bias model saved in a local directory, else None."""
    settings = getattr(model_config.hf_config, "natural_bias", None)
    if not isinstance(settings, dict) or not os.path.isdir(model_config.model):
        return None
    from safetensors import safe_open

    for path in sorted(glob.glob(os.path.join(model_config.model, "*.safetensors"))):
        with safe_open(path, "pt") as tensors:
            if BIAS in tensors.keys():
                bias = tensors.get_tensor(BIAS).float()
                return map_bias(bias, settings.get("logit_map")).float()
    return None


class BiasScale(LogitsProcessor):
    """Adds ``(lambda - 1) f(b)`` to the logits of each request that asks for lambda."""

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        requested_scale(sampling_params)

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        bias = saved_bias(vllm_config.model_config)
        self.bias = None if bias is None else bias.to(device)
        self.device = device
        self.scales: dict[int, float] = {}
        self.rows = self.shifts = None

    def is_argmax_invariant(self) -> bool:
        return False  # lambda b moves the argmax

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if process_dict_updates(self.scales, batch_update, self._new_state):
            rows = sorted(self.scales)
            self.rows = torch.tensor(rows, dtype=torch.long, device=self.device)
            scales = [self.scales[r] for r in rows]  # a column: one shift row a request
            column = torch.tensor(scales, dtype=torch.float64, device=self.device)[:, None]
            self.shifts = head.generation_shift(self.bias, column)

    def _new_state(self, params, prompt_ids, output_ids) -> float | None:
        scale = requested_scale(params)
        if scale is not None and self.bias is None:
            raise NaturalBiasError(
                f"{ARGUMENT} scales the natural bias, and this model has none "
                "(not a model saved by natbias.hf in a local directory)"
            )
        return scale

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.scales:
            n = min(logits.shape[-1], self.shifts.shape[-1])
            logits[self.rows, :n] += self.shifts[:, :n].to(logits.dtype)
        return logits
