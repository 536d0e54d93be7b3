"""add_natural_bias is in place in memory: the peak resident memory that
the call adds to a model is at most 5% of the model's parameters (it adds
b, the prior and a few vocabulary-sized vectors; no copy of W in any
dtype). Measured as the process's peak resident set (VmHWM, reset through
/proc/self/clear_refs before the call), which sees torch's allocations as
tracemalloc does not; the same measure is shown to see the float64 copy of
W that 2.1.0 made (issue 94). research/hf_memory.py measures a
GPT-2-small-sized model the same way."""

import gc
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from natbias.hf import add_natural_bias  # noqa: E402

CLEAR_REFS = Path("/proc/self/clear_refs")
if not CLEAR_REFS.exists():
    pytest.skip("the peak resident set is read from Linux's /proc", allow_module_level=True)


def resident(key: str) -> float:
    """VmRSS or VmHWM of this process, MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def peak_growth(call) -> float:
    """How far the resident set rose above where it was while ``call`` ran, MiB."""
    # Earlier tests' cyclic garbage first: collected inside the window, it would
    # free as much as the call allocates and hide it (a control read 0.016 MiB).
    gc.collect()
    CLEAR_REFS.write_text("5")  # VmHWM := VmRSS
    before = resident("VmRSS")
    call()
    return resident("VmHWM") - before


def test_add_natural_bias_adds_at_most_5_percent_of_the_model_at_its_peak():
    # W is 144 MiB (49,152 x 768, GPT-2's width), the whole model 171 MiB:
    # a copy of W in any dtype would be more than 80% of it.
    config = transformers.GPT2Config(
        vocab_size=49152, n_embd=768, n_layer=1, n_head=12, n_positions=64,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    size = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    weight = model.lm_head.weight.detach()
    with torch.no_grad():  # the first forward's one-time allocations, before measuring
        model.eval()(input_ids=torch.tensor([[0]]))
    phi = torch.randn(config.n_embd)
    # The measure sees a copy of W: 2.1.0's float64 product, W.double() @ phi
    # (copied whatever W's dtype: a float64 W would make .double() no copy).
    copy = peak_growth(
        lambda: torch.nn.functional.linear(phi.double(), weight.to(torch.float64, copy=True))
    )
    assert copy > 1.9 * weight.numel() * 4 / 2**20
    counts = np.ones(config.vocab_size, dtype=np.int64)
    growth = peak_growth(lambda: add_natural_bias(model, counts=counts))
    assert model.lm_head.weight.data_ptr() == weight.data_ptr()  # W kept, not copied
    assert growth <= 0.05 * size, f"+{growth:.1f} MiB for a model of {size:.1f} MiB"
