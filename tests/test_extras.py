"""Installed without an extra: without [plots] every console script starts (its
--help) and a figure asked for is refused in one line naming the extra; without
fairseq the plugin's console scripts say in one line what to install."""

import subprocess
import sys

import numpy as np
import tomllib
from natbias_testing import BIN, REPO

from fairseq_natbias import FAIRSEQ_MISSING

# One process for all scripts (each --help ends in SystemExit(0)), with
# matplotlib made unimportable by a package of that name that refuses.
CHECK = """
import importlib, sys
failed = []
for name, target in ENTRY_POINTS:
    module, function = target.split(":")
    sys.argv = [name, "--help"]
    try:
        getattr(importlib.import_module(module), function)()
    except SystemExit as stop:
        if stop.code not in (0, None):
            failed.append(name)
from natbias.errors import NaturalBiasError
from natbias.tools import plots
try:
    plots.pyplot()
except NaturalBiasError as error:
    print("refused:", error)
print("failed:", failed)
"""


def test_every_console_script_starts_without_matplotlib(tmp_path):
    (tmp_path / "matplotlib").mkdir()
    (tmp_path / "matplotlib/__init__.py").write_text("raise ImportError('hidden by the test')\n")
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert len(scripts) >= 7
    code = f"ENTRY_POINTS = {sorted(scripts.items())!r}\n{CHECK}"
    run = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": f"{tmp_path}:{REPO}", "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "failed: []" in run.stdout, run.stdout[-3000:]
    assert (
        "refused: matplotlib draws the figures: pip install 'fairseq-natbias[plots]'" in run.stdout
    )
    for name in scripts:  # argparse's usage line, or natbias-step0's own help
        assert f"usage: {name}" in run.stdout or f"{name}: " in run.stdout, name


def test_without_fairseq_the_plugins_scripts_say_what_to_install_in_one_line(tmp_path):
    (tmp_path / "fairseq").mkdir()
    (tmp_path / "fairseq/__init__.py").write_text("raise ImportError('hidden by the test')\n")
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    plugin_scripts = [
        name for name, target in scripts.items() if target.startswith("fairseq_natbias")
    ]
    assert {"natbias-step0", "natbias-average-checkpoints"} <= set(plugin_scripts)
    for name in plugin_scripts:
        run = subprocess.run(
            [str(BIN / name), "--help"],
            env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 1, (name, run.stdout, run.stderr)
        assert run.stderr.strip() == f"{name}: error: {FAIRSEQ_MISSING}", run.stderr


def test_without_fairseq_natbias_count_counts_token_files_and_refuses_text_in_one_line(tmp_path):
    """natbias-count is the core's: token files need no fairseq; its --text
    and --data (fairseq's part, by entry point) say what to install."""
    (tmp_path / "fairseq").mkdir()
    (tmp_path / "fairseq/__init__.py").write_text("raise ImportError('hidden by the test')\n")
    ids = np.array([3, 1, 4, 1, 5, 9, 2, 6], dtype=np.uint16)
    ids.tofile(tmp_path / "tokens.bin")
    (tmp_path / "text").write_text("a b\n")

    def run(*args):
        command = [str(BIN / "natbias-count"), *args, "--output", str(tmp_path / "out.counts")]
        env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
        return subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True)

    counted = run("--tokens", "tokens.bin", "--dtype", "uint16", "--vocab-size", "10")
    assert counted.returncode == 0, counted.stderr
    written = (tmp_path / "out.counts").read_text().splitlines()[1:]
    assert [int(line.split("\t")[1]) for line in written] == np.bincount(ids, minlength=10).tolist()
    refused = run("--dict", "dict.txt", "--text", "text")
    assert refused.returncode == 1
    assert refused.stderr.strip() == f"natbias-count: error: {FAIRSEQ_MISSING}"


def test_without_ctranslate2_the_converter_says_what_to_install_in_one_line(tmp_path):
    from natbias.ct2_converter import NO_CT2

    (tmp_path / "ctranslate2").mkdir()
    (tmp_path / "ctranslate2/__init__.py").write_text("raise ImportError('hidden by the test')\n")
    run = subprocess.run(
        [str(BIN / "natbias-ct2-converter"), "--help"],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, (run.stdout, run.stderr)
    assert run.stderr.strip() == f"natbias-ct2-converter: error: {NO_CT2}"
