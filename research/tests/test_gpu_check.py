"""research/gpu_check.py: its reading of fairseq 0.12's lines, each target made
to pass and to FAIL, the peak-memory fold against a stand-in for torch.cuda, and
the whole script with --smoke (CPU) on a slice of real Multi30k, run from a
Python whose folder has no fairseq scripts and with none on PATH (as after
``pip install --target`` on a lent GPU machine)."""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from natbias_testing import REPO, write_multi30k_slice
from research_scripts import benchmark_script

gpu_check = benchmark_script("gpu_check")
PREFIX = "2024-05-01 10:00:{:02d} | INFO | "


def inner(update, scale=None):
    scale = f", loss_scale={scale:g}" if scale is not None else ""
    return (
        PREFIX.format(update % 60) + f"train_inner | epoch 001:     {update} / 103 loss=13.1, "
        f"nll_loss=13.05, ppl=8480.1, wps=20311.2, ups=5, wpb=3967.2, bsz=140.2, "
        f"num_updates={update}, lr=1.34e-06, gnorm=4.5{scale}, gain=0.1, train_wall=2, wall=1"
    )


def overflow(scale, amp=False):
    if amp:
        return (
            PREFIX.format(0)
            + f"fairseq.trainer | AMP: overflow detected, setting scale to to {scale:.1f}"
        )
    return PREFIX.format(0) + (
        "fairseq.trainer | NOTE: gradient overflow detected, ignoring gradient, "
        f"setting loss scale to: {scale:.1f}"
    )


def run(levels, overflows_at=(), train_mib=1000, amp=False):
    """A finished run's record: train_inner lines every 10 updates at ``levels``."""
    lines = []
    for k, scale in enumerate(levels, start=1):
        lines += [overflow(scale, amp)] if k * 10 in overflows_at else []
        lines.append(inner(k * 10, scale))
    report = {"peak_train_bytes": train_mib * 2**20, "peak_valid_bytes": 2**30, "device": "H100"}
    return gpu_check.summarise_log([*lines, gpu_check.CHILD_MARK + json.dumps(report)])


STOCK = [64.0] * 3 + [128, 64, 128, 64, 128, 64, 128]


def test_a_log_is_read_as_fairseq_writes_it():
    record = run([512, 256, 32, 64, 128, 64, 64], overflows_at=(30,))  # 70 updates
    assert record["loss_scale"] == {"first": 512, "min": 32, "final_level": 128, "last": 64}
    assert record["overflow_steps"] == 1 and record["updates"] == 70 and record["gain"] == 0.1
    assert record["seconds_per_update"] == 0.2 and record["device"] == "H100"
    assert run([64, 16, 32], overflows_at=(20,), amp=True)["loss_scale"]["min"] == 16
    assert gpu_check.summarise_log([inner(10)])["loss_scale"] is None
    banner = ["ValueError: bad option", "torch.distributed.elastic.ChildFailedError:", "===="]
    assert gpu_check.error_line(banner) == "ValueError: bad option"


def test_each_target_passes_and_fails_on_constructed_runs():
    stock = run(STOCK, overflows_at=(50, 70))
    assert gpu_check.scale_cells([run(STOCK, (50, 70))], [stock]) == [
        *("64 vs 64: pass", "128 vs 128: pass", "2 vs 2: pass")
    ]
    lower = run([s / 2 for s in STOCK], overflows_at=(50, 60, 70))
    assert gpu_check.scale_cells([lower], [stock]) == [
        *("32 vs 64: FAIL", "64 vs 128: FAIL", "3 vs 2: FAIL")
    ]
    assert gpu_check.scale_cells([stock, lower], [stock])[0] == "32 vs 64: FAIL"  # worst run
    fp32 = gpu_check.summarise_log([inner(10), inner(20)])
    assert gpu_check.scale_cells([fp32], [fp32]) == ["n/a (no loss scaling)"] * 3
    key, target = "peak_train_bytes", gpu_check.TARGET_RATIO
    assert gpu_check.ratio_cell([run(STOCK, train_mib=1010)], [stock], key, target) == "1.010: pass"
    assert gpu_check.ratio_cell([run(STOCK, train_mib=1100)], [stock], key, target) == "1.100: FAIL"


class FakeCuda:
    """torch.cuda's peak statistics: ``allocate(n)`` is a moment at n bytes."""

    def __init__(self):
        self.peak = 0

    def allocate(self, nbytes):
        self.peak = max(self.peak, nbytes)

    def max_memory_allocated(self):
        return self.peak

    def reset_peak_memory_stats(self):
        self.peak = 0


def test_peak_memory_folds_fairseqs_resets_and_keeps_validation_apart():
    cuda = FakeCuda()
    memory = gpu_check.PeakMemory(cuda)
    for nbytes in (700, 1200, 800):  # as fairseq's Trainer.train_step: read, then reset
        cuda.allocate(nbytes)
        memory.reset_peak_memory_stats()
    assert memory.around_validation(lambda: cuda.allocate(1100) or [2.0])() == [2.0]
    cuda.allocate(300)  # after the last reset: what reading once at the end gives
    assert memory.finish() == {"train": 1200, "valid": 1100}
    parsed = type("args", (), {"tpu": True})()
    assert gpu_check.without_implied_tpu(lambda: parsed, ["--bf16"])().tpu is False


def test_the_preset_sizes_are_the_registered_ones():
    sizes = gpu_check.sizes(smoke=False)
    assert "--encoder-embed-dim=256" in sizes and "--decoder-ffn-embed-dim=256" in sizes
    assert "--decoder-layers=6" in sizes and len(sizes) == 8


def bare_python(root):
    """The .venv's interpreter outside the .venv, its packages on PYTHONPATH, and
    a PATH without fairseq's scripts."""
    base = Path(getattr(sys, "_base_executable", sys.executable))
    (root / "bin").mkdir(parents=True, exist_ok=True)
    (python := root / "bin" / "python3").symlink_to(base.resolve())
    env = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"}
    env.update(PYTHONPATH=sysconfig.get_paths()["purelib"], PYTHONNOUSERSITE="1")
    env.update(PATH=f"{root / 'bin'}:/usr/bin:/bin", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return python, env


def gpu_check_run(python, env, *args):
    command = [str(python), str(REPO / "research" / "gpu_check.py"), *map(str, args)]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.training
def test_smoke_runs_every_step_without_fairseqs_scripts_and_skips_them_again(tmp_path):
    (tmp_path / "multi30k").mkdir()
    data = write_multi30k_slice(
        tmp_path / "multi30k", {"train": 1500, "val": 60, "test_2016_flickr": 40}
    )
    python, env = bare_python(tmp_path / "bare")
    work = tmp_path / "work"
    args = [
        "--smoke",
        "--multi30k",
        data,
        "--workdir",
        work,
        "--vocab-size",
        1000,
        "--copy-to",
        work / "out",
    ]
    first = gpu_check_run(python, env, *args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    table = (work / "gpu_check.md").read_text()
    assert table == (work / "out" / "gpu_check.md").read_text() and table in first.stdout
    assert (
        "device: CPU smoke" in table
        and "fairseq-generate (beam 5, --fp32 default 1's checkpoint): `Generate test with beam=5: BLEU4 = "
        in table
    )
    for arm in ("default", "stock", "hookoff", "torchrun"):
        assert f"| fp32 | {arm} | 1 | CPU smoke | 2 | — | — | — | — | 0 |" in table
    assert (
        "| fp32 | n/a (no loss scaling) | n/a (no loss scaling) | n/a (no loss scaling) | — |"
        in table
    )
    again = gpu_check_run(python, env, *args)
    for name in ("fp32 default 1", "fp32 stock 1", "fp32 hookoff 1", "torchrun", "generate"):
        assert f"{name}: finished before, skipped" in again.stdout
    assert (work / "gpu_check.md").read_text() == table
    no_gpu = gpu_check_run(python, env, "--multi30k", data, "--workdir", tmp_path / "w2")
    assert no_gpu.returncode == 1 and no_gpu.stderr.startswith("gpu_check: no CUDA GPU: ")
    assert not (tmp_path / "w2").exists()
