"""Importing the plugin registers with fairseq, always; the text-only tools
(natbias.tools) start without torch or fairseq; one version everywhere."""

import json
import os
import subprocess
import sys

from natbias_testing import BIN, REPO, script_python, top_level_imports

import fairseq_natbias


def _simple_log(points):
    return "".join(
        f"2026-01-01 10:00:00 | INFO | train_inner | epoch 001:  {u:5d} / 9 loss=4.4, "
        f"kl_unigram=0.5, kl_uniform=1.2, bias_norm=30.0, bias_kl=0.1, num_updates={u}\n"
        f"2026-01-01 10:00:00 | INFO | valid | epoch 001 | valid on 'valid' subset | "
        f"loss 4.5 | bleu {bleu} | num_updates {u}\n"
        for u, bleu in points
    )


def _run_profiled(tool, *args):
    """``tool`` (an installed console script, or a command line as a list)
    with Python's import-time report on stderr."""
    env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1", PYTHONWARNINGS="ignore")
    command = [str(BIN / tool)] if isinstance(tool, str) else list(map(str, tool))
    return subprocess.run(
        [*command, *map(str, args)], capture_output=True, text=True, env=env, timeout=120
    )


def _assert_ran_without_torch(name, done):
    assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr[-2000:]}"
    imported = top_level_imports(done.stderr)
    assert "natbias" in imported, name  # the package itself was imported
    assert not imported & {"torch", "fairseq", "fairseq_natbias"}, (name, imported)


def test_log_only_tools_do_their_work_without_torch_or_fairseq(tmp_path):
    """The installed console scripts, as a user starts them."""
    log = tmp_path / "grid" / "toy" / "unigram" / "seed1" / "train.log"
    log.parent.mkdir(parents=True)
    log.write_text(_simple_log([(4, 10.0), (8, 20.0)]))
    (log.parent / "test.bleu.json").write_text(
        json.dumps({"name": "BLEU", "score": 30.0, "signature": "nrefs:1|tok:13a"})
    )
    (log.parent / "test.chrf.json").write_text("50.0\n")
    runs = {
        "natbias-alc": [log, "--max-updates", "0"],
        "natbias-dynamics": [
            "--log",
            f"unigram={log}",
            "--metrics",
            "bias_kl",
            "--out-dir",
            tmp_path / "dynamics",
        ],
        "natbias-report": [tmp_path / "grid", "--out-dir", tmp_path / "report"],
    }
    for tool, args in runs.items():
        done = _run_profiled(tool, *args)
        _assert_ran_without_torch(tool, done)
        assert "numpy" in top_level_imports(done.stderr), tool  # the log was read
    # Their outputs: the ALC of the curve (10 at 4, 20 at 8, over 4..8: 15) ...
    alc_line = subprocess.run(
        [str(BIN / "natbias-alc"), str(log), "--max-updates", "0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()[0]
    assert alc_line.split("\t")[1].startswith("15.0000")
    # ... a plot and a table.
    assert (tmp_path / "dynamics" / "bias_kl.png").stat().st_size > 10_000
    assert any(path.suffix == ".md" for path in (tmp_path / "report").iterdir())


def test_text_helpers_of_the_recipes_and_examples_start_without_torch(tmp_path):
    """recipes/natbias_tools.py, examples/translation/spm_text.py and
    examples/paper/multi30k.py as lib.sh and the examples call
    them: their work done (a SentencePiece model, text encoded with it, the
    data folder found) without torch or fairseq."""
    lines = [f"der hund {i} sieht die katze {i % 7} im garten" for i in range(300)]
    (tmp_path / "train.de").write_text("\n".join(lines) + "\n")
    spm_text = [sys.executable, REPO / "examples/translation/spm_text.py"]
    tools = [sys.executable, REPO / "recipes/natbias_tools.py"]
    multi30k = [sys.executable, REPO / "examples/paper/multi30k.py"]
    for name, command, args in [
        (
            "spm_text.py train",
            spm_text,
            [
                "train",
                "--model-prefix",
                tmp_path / "spm",
                "--vocab-size",
                40,
                tmp_path / "train.de",
            ],
        ),
        (
            "natbias_tools.py spm-encode",
            tools,
            [
                "spm-encode",
                "--model",
                tmp_path / "spm.model",
                "--input",
                tmp_path / "train.de",
                "--output-dir",
                tmp_path / "pieces",
            ],
        ),
        ("multi30k.py", multi30k, [tmp_path / "cache", "--data", tmp_path, "--langs", "de"]),
    ]:
        done = _run_profiled(command, *args)
        if name == "multi30k.py":
            # The folder has train.de only: refused, after a start without torch.
            assert done.returncode == 1 and "has no val.de, test_2016_flickr.de" in done.stderr
            done.returncode = 0
        _assert_ran_without_torch(name, done)
    pieces = (tmp_path / "pieces/train.de").read_text().splitlines()
    assert ["".join(p.split()).replace("\u2581", " ").strip() for p in pieces] == lines


def test_any_other_process_registers_on_import():
    """fairseq's CLIs import the package by --user-dir: registration must not wait."""
    code = (
        "import fairseq_natbias\n"
        "from fairseq.models import ARCH_MODEL_REGISTRY\n"
        "from fairseq.criterions import CRITERION_REGISTRY\n"
        "print('transformer_natbias' in ARCH_MODEL_REGISTRY,"
        " 'transformer_lm_natbias' in ARCH_MODEL_REGISTRY,"
        " 'unigram_regularized_cross_entropy' in CRITERION_REGISTRY)"
    )
    out = subprocess.run(
        [script_python(), "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["True", "True", "True"]


def test_importing_twice_is_harmless():
    import importlib

    from fairseq.models import ARCH_MODEL_REGISTRY

    importlib.import_module("fairseq_natbias")
    importlib.import_module("fairseq_natbias.transformer_natbias")
    assert "transformer_natbias" in ARCH_MODEL_REGISTRY


def test_one_version_everywhere():
    """The packages, the distribution's metadata and CITATION.cff name the same version."""
    import re
    from importlib.metadata import version

    import natbias

    citation = re.search(r"^version: (\S+)$", (REPO / "CITATION.cff").read_text(), re.M)[1]
    assert fairseq_natbias.__version__ == natbias.__version__ == version("fairseq-natbias")
    assert citation == natbias.__version__
    assert 'version = { attr = "natbias.__version__" }' in (REPO / "pyproject.toml").read_text()
