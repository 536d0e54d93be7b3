"""add_natural_bias is in place in memory: the peak memory that the call adds
to a model is at most 5% of the model's parameters (it adds b, the prior and a
few vocabulary-sized vectors; no copy of W in any dtype).

Measured as the allocations themselves, not the process's resident set: torch's
through its profiler (each tensor's allocation and free, in order), numpy's and
Python's through tracemalloc. The resident set (VmHWM) read 0.0 MiB for a 288
MiB copy on the CI machine once (reclaim or a reused heap hides it), so a bound
on it could pass for the wrong reason or fail for none. Each measure is shown to
see the float64 copy of W that 2.1.0 made (issue 94). research/hf_memory.py
measures a GPT-2-small-sized model's resident set in a fresh process."""

import gc
import tracemalloc

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

transformers = pytest.importorskip("transformers")

from natbias.hf import add_natural_bias  # noqa: E402


def peak_growth(call) -> float:
    """How far torch's plus numpy's allocations rose above where they were while ``call`` ran, MiB."""
    gc.collect()  # earlier tests' garbage, freed inside the window, would offset the call's allocations
    tracemalloc.start()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        call()
    numpy_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # An op's own allocation is its self memory at its start; a free is a "[memory]"
    # event with negative bytes. The running sum's maximum is the peak.
    running = torch_peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        running += event.self_cpu_memory_usage
        torch_peak = max(torch_peak, running)
    return (torch_peak + numpy_peak) / 2**20


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
    phi = torch.randn(config.n_embd)
    copy_mib = weight.numel() * 8 / 2**20
    # The measure sees a copy of W: 2.1.0's float64 product, W.double() @ phi,
    # made by torch and, as a numpy user would write it, by numpy.
    by_torch = peak_growth(
        lambda: torch.nn.functional.linear(phi.double(), weight.to(torch.float64, copy=True))
    )
    by_numpy = peak_growth(lambda: weight.numpy().astype(np.float64) @ phi.double().numpy())
    assert by_torch >= copy_mib and by_numpy >= copy_mib, (by_torch, by_numpy)
    counts = np.ones(config.vocab_size, dtype=np.int64)
    growth = peak_growth(lambda: add_natural_bias(model, counts=counts))
    assert model.lm_head.weight.data_ptr() == weight.data_ptr()  # W kept, not copied
    assert growth <= 0.05 * size, f"+{growth:.1f} MiB for a model of {size:.1f} MiB"
