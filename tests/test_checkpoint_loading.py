"""checkpoint_loading: the one reader of fairseq checkpoints, and its refusals,
which the readers built on it (fairseq_natbias.scoring's
read_with_fairseq, examples/paper/sweep.py's has_output_bias) give as well.
Whether a checkpoint is one of the package's models (natural_bias.py):
test_natural_bias.py.

Uses the v1.0.0 fixture checkpoint (tests/fixtures/v1.0.0): a real
transformer_natbias checkpoint whose configuration is an argparse.Namespace.
"""

import argparse
import datetime
from pathlib import Path

import numpy as np
import pytest
import torch
from sweep import has_output_bias
from test_imports import import_graph, reachable

from fairseq_natbias import checkpoint_loading
from fairseq_natbias.checkpoint_loading import CheckpointError
from fairseq_natbias.scoring import read_with_fairseq
from natbias.errors import NaturalBiasError

FIXTURE = Path(__file__).parent / "fixtures/v1.0.0/checkpoint_last.pt"


@pytest.fixture(scope="module")
def fixture_state():
    return checkpoint_loading.read_checkpoint(str(FIXTURE))


def _saved(tmp_path, state, name="changed.pt"):
    path = tmp_path / name
    torch.save(state, path)
    return str(path)


def test_reads_what_fairseq_saved_under_weights_only_loading(fixture_state, tmp_path):
    """argparse.Namespace (the configuration) and numpy arrays (what
    --eval-bleu leaves in the metrics) are allow-listed: torch's default
    weights-only loading reads them."""
    saved = checkpoint_loading.saved_model_args(str(FIXTURE))
    assert isinstance(saved, argparse.Namespace)
    assert (saved.arch, saved.natbias_init) == ("transformer_natbias", "unigram")
    with_numpy = dict(fixture_state, extra_state={"bleu_counts": np.arange(4)})
    state = torch.load(_saved(tmp_path, with_numpy), map_location="cpu")  # weights_only default
    assert state["extra_state"]["bleu_counts"].tolist() == [0, 1, 2, 3]


def test_both_readers_read_numpy_arrays_after_transformers_took_them_off_the_list(
    fixture_state, tmp_path
):
    """transformers' Trainer resumes inside its safe_globals block, which takes
    numpy's types off torch's allow-list when it ends, ours too: a process
    that resumed a Trainer still reads fairseq's checkpoints."""
    trainer_pt_utils = pytest.importorskip("transformers.trainer_pt_utils")
    path = _saved(tmp_path, dict(fixture_state, extra_state={"bleu_counts": np.arange(4)}))
    try:
        with trainer_pt_utils.safe_globals():
            pass
        assert np.ndarray not in torch.serialization.get_safe_globals()  # the list it leaves
        for read in (checkpoint_loading.read_checkpoint, lambda p: read_with_fairseq(p, {})):
            assert read(path)["extra_state"]["bleu_counts"].tolist() == [0, 1, 2, 3]
    finally:
        checkpoint_loading.allow_fairseq_checkpoints()  # for the tests after this one


def test_the_configuration_comes_from_cfg_else_from_args(fixture_state, tmp_path):
    model_args = checkpoint_loading.saved_model_args(str(FIXTURE))
    as_args = {k: v for k, v in fixture_state.items() if k != "cfg"}
    as_args["args"] = model_args
    assert checkpoint_loading.saved_model_args(_saved(tmp_path, as_args)).arch == model_args.arch
    neither = {k: v for k, v in fixture_state.items() if k not in ("cfg", "args")}
    assert checkpoint_loading.saved_model_args(_saved(tmp_path, neither)) is None


def test_output_bias_is_read_from_the_state(fixture_state, tmp_path):
    assert has_output_bias(str(FIXTURE)) is True
    model = {
        k: v for k, v in fixture_state["model"].items() if k != "decoder.output_projection.bias"
    }
    assert has_output_bias(_saved(tmp_path, dict(fixture_state, model=model))) is False
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint\n")
    with pytest.raises(CheckpointError, match="garbage.pt is not a fairseq checkpoint"):
        has_output_bias(str(garbage))


def test_files_that_are_no_checkpoint_are_named_with_the_fix(tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint\n" * 4)
    refusals = {
        str(tmp_path / "missing.pt"): "missing.pt: no such checkpoint; train a model first",
        str(tmp_path): "is a directory: give the checkpoint file in it",
        str(garbage): r"garbage.pt is not a fairseq checkpoint \(not a torch.save archive\)",
        _saved(tmp_path, [1, 2, 3]): "holds a list, not a fairseq checkpoint",
    }
    text = tmp_path / "dict.en.txt"  # a text file: torch's unpickler fails with an IndexError
    text.write_text("the 10\nis 5\n", encoding="utf-8")
    refusals[str(text)] = r"dict.en.txt is not a fairseq checkpoint \(not a torch.save archive\)"
    for path, message in refusals.items():
        with pytest.raises(CheckpointError, match=message):
            checkpoint_loading.saved_model_args(path)
        with pytest.raises(CheckpointError, match=message):  # fairseq's own reading
            read_with_fairseq(path, {})
    # One line for the analysis tools (NaturalBiasError) and for fairseq-train's
    # model building, which reports ValueErrors without a traceback.
    assert issubclass(CheckpointError, NaturalBiasError) and issubclass(CheckpointError, ValueError)


def test_types_nobody_allow_listed_get_the_hint(fixture_state, tmp_path):
    dated = _saved(tmp_path, dict(fixture_state, when=datetime.date(2023, 7, 9)))
    for read in (checkpoint_loading.read_checkpoint, lambda path: read_with_fairseq(path, {})):
        with pytest.raises(
            CheckpointError,
            match="weights-only loading refused the checkpoint.*TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1",
        ):
            read(dated)


def test_the_reader_knows_nothing_of_models_or_analysis():
    """The plugin's ground floor: it imports nothing of the plugin, yet its
    error is the NaturalBiasError the tools print."""
    assert not reachable(import_graph(), "fairseq_natbias.checkpoint_loading")
    assert issubclass(CheckpointError, NaturalBiasError)
    assert CheckpointError is checkpoint_loading.CheckpointError
    assert not hasattr(checkpoint_loading, "check_natbias_checkpoint")
