"""fairseq's checkpoint tools with the default model (docs/checkpoints.md):
natbias-average-checkpoints (fairseq's scripts/average_checkpoints.py is not in
the fairseq wheels, and cannot unpickle fairseq's saved config under torch >= 2.6
without the plugin), and fairseq-generate's ensembles (--path a.pt:b.pt) of
models with different biases. Tiny models on the toy data, 2-4 updates."""

import math
import re

import pytest
import torch
from natbias_testing import BIN, NO_LOADER_PROCESS, fairseq, train

import fairseq_natbias  # noqa: F401  (lets torch.load read fairseq's saved config here too)

AVERAGE = BIN / "natbias-average-checkpoints"
GENERATE = (
    "--beam",
    "2",
    "--batch-size",
    "8",
    "--required-batch-size-multiple",
    "1",
    "--cpu",
    "--num-workers",
    "0",
)


def average(*args):
    assert AVERAGE.is_file()
    return fairseq("natbias-average-checkpoints", *args, check=False)


def assert_one_line_error(result, *fragments):
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("natbias-average-checkpoints: error: "), (
        result.stderr
    )
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def model_tensors(path):
    return torch.load(path, map_location="cpu")["model"]


@pytest.fixture(scope="module")
def unigram_run(toy_bin, tmp_path_factory):
    """The default model (unigram bias, gain init), 4 updates of ~500 tokens,
    a checkpoint every 2 updates: checkpoint_1_2.pt and checkpoint_1_4.pt."""
    save_dir = tmp_path_factory.mktemp("unigram_run")
    train(toy_bin, save_dir, "--max-tokens", "500", "--save-interval-updates", "2", max_update=4)
    return save_dir


@pytest.fixture(scope="module")
def zero_run(toy_bin, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("zero_run")
    train(toy_bin, save_dir, "--max-tokens", "500", "--natbias-init", "zero", max_update=2)
    return save_dir


def generated(data, path, *extra):
    """fairseq-generate's output on the test split: {id: hypothesis} and the text."""
    output = fairseq(
        "fairseq-generate",
        *NO_LOADER_PROCESS,
        data,
        "--user-dir",
        "fairseq_natbias",
        "--path",
        path,
        *GENERATE,
        *extra,
    ).stdout
    hypotheses = dict(re.findall(r"^H-(\d+)\t\S+\t(.*)$", output, re.M))
    return hypotheses, output


@pytest.fixture(scope="module")
def averaged(unigram_run, tmp_path_factory):
    """The run's last two update checkpoints averaged, found by their names."""
    output = tmp_path_factory.mktemp("averaged") / "averaged.pt"
    result = average("--inputs", unigram_run, "--num-update-checkpoints", "2", "--output", output)
    assert result.returncode == 0, result.stderr
    return output, result


@pytest.mark.training
def test_averaging_two_default_checkpoints_loads_and_generates(unigram_run, averaged, toy_bin):
    output, result = averaged
    newest, older = unigram_run / "checkpoint_1_4.pt", unigram_run / "checkpoint_1_2.pt"
    assert f"averaged 2 checkpoints: {newest} {older}" in result.stdout
    first, second, mean = map(model_tensors, (newest, older, output))
    assert mean.keys() == first.keys()
    # the output bias, the gain's parameter and every weight: the mean of the two
    assert "decoder.output_projection.gain_param" in mean
    for name, tensor in mean.items():
        assert tensor.dtype == first[name].dtype
        torch.testing.assert_close(
            tensor, (first[name] + second[name]) / 2, rtol=1e-6, atol=1e-7, msg=name
        )
    assert not torch.equal(
        first["decoder.output_projection.bias"], second["decoder.output_projection.bias"]
    )  # a real average
    hypotheses, _ = generated(toy_bin, output)
    assert sorted(map(int, hypotheses)) == list(range(20))  # every test sentence


@pytest.mark.training
def test_averaging_named_inputs_gives_the_same_checkpoint(unigram_run, averaged, tmp_path):
    named = tmp_path / "named.pt"
    assert (
        average(
            "--inputs",
            unigram_run / "checkpoint_1_4.pt",
            unigram_run / "checkpoint_1_2.pt",
            "--output",
            named,
        ).returncode
        == 0
    )
    one, other = model_tensors(averaged[0]), model_tensors(named)
    assert all(torch.equal(one[name], other[name]) for name in one)


@pytest.mark.training
def test_averaging_refuses_different_natbias_inits(unigram_run, zero_run, tmp_path):
    result = average(
        "--inputs",
        unigram_run / "checkpoint_last.pt",
        zero_run / "checkpoint_last.pt",
        "--output",
        tmp_path / "mixed.pt",
    )
    assert_one_line_error(
        result, "--natbias-init unigram", "--natbias-init zero", "average checkpoints of one run"
    )
    assert not (tmp_path / "mixed.pt").exists()


@pytest.mark.training
def test_averaging_refuses_different_vocabularies(unigram_run, toy_bin_joined, tmp_path):
    joined = tmp_path / "joined"
    train(toy_bin_joined, joined, "--max-tokens", "500", max_update=2)
    result = average(
        "--inputs",
        unigram_run / "checkpoint_last.pt",
        joined / "checkpoint_last.pt",
        "--output",
        tmp_path / "mixed.pt",
    )
    assert_one_line_error(result, "different vocabularies", "one dictionary")
    assert not (tmp_path / "mixed.pt").exists()


@pytest.mark.training
def test_averaging_refuses_fewer_checkpoints_than_asked(unigram_run, tmp_path):
    result = average(
        "--inputs", unigram_run, "--num-update-checkpoints", "3", "--output", tmp_path / "avg.pt"
    )
    assert_one_line_error(
        result, "holds 2 checkpoint_<epoch>_<update>.pt files", "fewer than the 3 asked for"
    )


@pytest.mark.training
def test_ensemble_of_a_unigram_and_a_zero_model(unigram_run, zero_run, toy_bin):
    """fairseq-generate --path unigram.pt:zero.pt generates, and really
    averages the two models: scoring the references, each token's ensemble
    log-probability is log((p_unigram + p_zero) / 2) of the two models alone."""
    unigram, zero = unigram_run / "checkpoint_last.pt", zero_run / "checkpoint_last.pt"
    hypotheses, _ = generated(toy_bin, f"{unigram}:{zero}")
    assert sorted(map(int, hypotheses)) == list(range(20))

    def reference_scores(path):
        _, output = generated(toy_bin, path, "--score-reference")
        return {
            int(i): [float(v) for v in scores.split()]
            for i, scores in re.findall(r"^P-(\d+)\t(.*)$", output, re.M)
        }

    alone_unigram, alone_zero = reference_scores(unigram), reference_scores(zero)
    ensemble = reference_scores(f"{unigram}:{zero}")
    assert sorted(ensemble) == list(range(20))
    for i, scores in ensemble.items():
        expected = [
            math.log2((2**a + 2**b) / 2)
            for a, b in zip(alone_unigram[i], alone_zero[i], strict=True)
        ]
        # printed to 4 decimals (base 2)
        assert scores == pytest.approx(expected, abs=2e-4)
    assert alone_unigram != alone_zero  # two different models, not one twice
