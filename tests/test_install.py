"""Installing into an environment that already has fairseq
(docs/installation.md): the package built as a wheel, installed with
--no-deps somewhere else than this checkout, and used by the environment's own
fairseq-train through --user-dir from an unrelated directory."""

import email
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
from natbias_testing import BIN, REPO, TINY_MODEL, TINY_TRAINING

# What a wheel is built from; copied so the build leaves nothing in the
# checkout (setuptools writes build/ and *.egg-info next to pyproject.toml).
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "natbias", "fairseq_natbias")


def pip(*args, cwd):
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    root = tmp_path_factory.mktemp("build")
    for name in SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(
                source, root / "src" / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            (root / "src").mkdir(exist_ok=True)
            shutil.copy(source, root / "src" / name)
    pip(
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-w",
        root / "dist",
        root / "src",
        cwd=root,
    )
    (built,) = (root / "dist").glob("fairseq_natbias-*.whl")
    return built


def test_the_wheel_carries_licence_versions_and_readme(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = email.message_from_string(archive.read(info).decode("utf-8"))
        licence = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert licence and archive.read(licence[0]) == (REPO / "LICENSE").read_bytes()
        entry_points = archive.read(info.replace("METADATA", "entry_points.txt")).decode()
    assert "MIT" in (metadata["License-Expression"], metadata["License"])
    # The core and the transformers extra install where transformers users are
    # (3.10 on); fairseq's needs come with the [fairseq] extra only.
    assert metadata["Requires-Python"] == ">=3.10"
    assert "Programming Language :: Python :: 3.13" in metadata.get_all("Classifier")
    base = {
        r.split(">")[0].split("<")[0].split("=")[0].strip()
        for r in metadata.get_all("Requires-Dist")
        if "extra ==" not in r
    }
    assert base == {"torch", "numpy", "tqdm"}  # tqdm: the counting engine's progress bar
    fairseq_needs = [r for r in metadata.get_all("Requires-Dist") if 'extra == "fairseq"' in r]
    assert any(r.startswith("hydra-core") for r in fairseq_needs)
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert metadata.get_payload().strip() == (REPO / "README.md").read_text().strip()
    assert (
        "natbias-average-checkpoints = fairseq_natbias.cli.average_checkpoints:main" in entry_points
    )
    assert "natbias-alc = natbias.tools.cli:alc_main" in entry_points
    assert "natbias-ct2-converter = natbias.ct2_converter:main" in entry_points
    assert {
        "natbias/projection.py",
        "natbias/tools/sentencepiece_text.py",
        "natbias/hf/models.py",
        "fairseq_natbias/natural_bias.py",
    } <= set(names)
    assert not [n for n in names if n.startswith(("tests/", "research/", "examples/"))]
    assert {"fairseq", "hf", "plots", "ctranslate2", "test"} <= set(
        metadata.get_all("Provides-Extra")
    )
    assert 'ctranslate2<5,>=4.8; extra == "ctranslate2"' in metadata.get_all("Requires-Dist")


@pytest.mark.training
def test_installed_elsewhere_trains_with_fairseq_from_another_directory(wheel, toy_bin, tmp_path):
    site = tmp_path / "site"
    # --no-compile: no bytecode yet, so bytecode written below proves that this
    # copy, not the checkout's or the virtual environment's, was imported.
    pip("install", "--no-deps", "--no-index", "--no-compile", "--target", site, wheel, cwd=tmp_path)
    plugin = site / "fairseq_natbias"
    assert not (plugin / "__pycache__").exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")
    }
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    result = subprocess.run(
        [
            str(BIN / "fairseq-train"),
            str(toy_bin),
            "--user-dir",
            str(plugin),
            "--arch",
            "transformer_natbias",
            *TINY_MODEL,
            *TINY_TRAINING,
            "--max-update",
            "2",
            "--save-dir",
            str(tmp_path / "checkpoints"),
        ],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    log = result.stdout + result.stderr
    # the plugin's own statistics on fairseq's training lines: the default
    # model (unigram bias, gain init) was built and trained
    assert "num_updates 2" in log and "kl_unigram" in log and "gain" in log
    assert (plugin / "__pycache__").is_dir()
    assert (tmp_path / "checkpoints/checkpoint_last.pt").exists()
    assert not any(elsewhere.iterdir())
