"""A checkpoint's natural-bias settings for the model that loads it
(fairseq_natbias/checkpoint_settings.py): earlier versions' checkpoints load,
resume and generate as before; resuming with other settings is refused in one
line, by every way fairseq resumes; fine-tuning says what it does with the bias."""

import argparse
import filecmp
import math
import shutil
from pathlib import Path

import pytest
import torch
from fairseq import checkpoint_utils

from fairseq_natbias import checkpoint_settings, natural_bias_options
from fairseq_natbias.checkpoint_settings import saved_model_args
from fairseq_natbias.natural_bias_options import NaturalBiasError
from natbias_testing import fairseq, train

FIXTURES = Path(__file__).parent / "fixtures"
V010 = FIXTURES / "v0.1.0"
V020 = FIXTURES / "v0.2.0"  # made with the same model and commands as v0.1.0's
V039 = FIXTURES / "v0.3.9"  # the same, and its uncapped linear gain started at 1.5
# 0.7.0's, made with the same model and commands, with settings 0.8.0 retired:
V070_EXP_PEAK = FIXTURES / "v0.7.0-exp-peak"  # --natbias-gain-form exp --natbias-gain-schedule peak
V070_DAMPED = FIXTURES / "v0.7.0-damped"  # --natbias-weight-init damped
# fairseq-train's options for the exp-peak fixture beyond V010_MODEL and the
# tests' training options: what a user resuming it would give again.
V070_EXP_PEAK_OPTIONS = ["--natbias-gain-form", "exp", "--natbias-gain-schedule", "peak",
                         "--warmup-init-lr", "1e-7"]
# The model of the v0.1.0 checkpoint (its README says how it was made).
V010_MODEL = [
    "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--share-decoder-input-output-embed",
]
GENERATE = ["--beam", "5", "--cpu", "--max-len-b", "10", "--required-batch-size-multiple", "1"]


# --- checkpoints of earlier versions ----------------------------------------------------


OLD_FIXTURES = [V010, V020, V039, V070_EXP_PEAK, V070_DAMPED]
OLD_FIXTURE_IDS = ["v0.1.0", "v0.2.0", "v0.3.9", "v0.7.0-exp-peak", "v0.7.0-damped"]


@pytest.mark.parametrize("fixture", OLD_FIXTURES, ids=OLD_FIXTURE_IDS)
def test_old_fixtures_match_the_toy_corpus(toy_bin, fixture):
    for name in ("dict.src.txt", "dict.tgt.txt"):
        assert filecmp.cmp(toy_bin / name, fixture / name, shallow=False), name


def test_v020_checkpoint_builds_its_linear_gain_exactly(toy_bin):
    """0.2.0's gain was g = C u; its checkpoint recorded no gain form. Loaded
    now it gets the linear form, so g = 20 u (0.0381) as it trained to."""
    path = V020 / "checkpoint_last.pt"
    models, cfg, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)], arg_overrides={"data": str(toy_bin)})
    saved = torch.load(path, map_location="cpu", weights_only=False)["model"]
    built = models[0].state_dict()
    assert cfg.model.natbias_weight_init == "gain" and cfg.model.natbias_gain_form == "linear"
    assert sorted(built) == sorted(saved)
    assert all(torch.equal(built[name], saved[name]) for name in saved)
    u = saved["decoder.output_projection.gain_param"].item()
    gain = models[0].decoder.output_projection.gain().item()
    assert gain == pytest.approx(20.0 * u, rel=1e-6)
    assert gain < 0.05  # it dipped in its 4 updates; exp(20 u) would be ~1.0


def test_v020_checkpoint_resumes_with_its_linear_gain_whatever_the_default(monkeypatch):
    """0.2.0 recorded no gain form: resuming reads it as linear even where
    the default form is another, and takes it (the option was defaulted)."""
    monkeypatch.setitem(natural_bias_options.DEFAULTS, "natbias_gain_form", "exp")
    args = argparse.Namespace()
    natural_bias_options.set_defaults(args)
    assert args.natbias_gain_form == "exp" and args.natbias_gain_speed == 100
    checkpoint_settings.reconcile_with_checkpoint(args, "resume", str(V020 / "checkpoint_last.pt"))
    assert (args.natbias_gain_form, args.natbias_gain_speed) == ("linear", 20)


def test_v039_checkpoint_keeps_its_uncapped_gain_above_one(toy_bin):
    """0.3.9's default gain was linear and uncapped, and recorded so; 0.4.0's
    default is capped. Loaded now, its g is 20 u = 1.488, not cut to 1."""
    path = V039 / "checkpoint_last.pt"
    models, cfg, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)], arg_overrides={"data": str(toy_bin)})
    saved = torch.load(path, map_location="cpu", weights_only=False)["model"]
    assert cfg.model.natbias_gain_form == "linear"
    u = saved["decoder.output_projection.gain_param"].item()
    gain = models[0].decoder.output_projection.gain().item()
    assert gain == pytest.approx(20.0 * u, rel=1e-6) and gain > 1.4


def test_v039_checkpoint_resumes_with_its_linear_gain(toy_bin, tmp_path):
    _, state = _resume_fixture(V039, toy_bin, tmp_path)
    assert state["cfg"]["model"].natbias_gain_form == "linear"
    assert 20.0 * state["model"]["decoder.output_projection.gain_param"].item() > 1.4


def _resume_fixture(fixture, toy_bin, tmp_path, *options):
    """fairseq-train resumes the fixture's checkpoint (4 updates) to update 6,
    with ``options`` besides the fixture's model; returns the log and the
    checkpoint it wrote."""
    save_dir = tmp_path / "ckpt"
    save_dir.mkdir()
    shutil.copy(fixture / "checkpoint_last.pt", save_dir / "checkpoint_last.pt")
    result = train(toy_bin, save_dir, *V010_MODEL, *options, model=[], max_update=6)
    log = result.stdout + result.stderr
    assert "@ 4 updates" in log  # really resumed
    return log, torch.load(save_dir / "checkpoint_last.pt", map_location="cpu")


def test_v020_checkpoint_resumes_through_fairseq_train(toy_bin, tmp_path):
    _, state = _resume_fixture(V020, toy_bin, tmp_path)
    assert state["cfg"]["model"].natbias_gain_form == "linear"  # now recorded
    assert state["cfg"]["model"].natbias_gain_schedule == "lr"  # 0.3.3's option, read as before
    assert state["optimizer_history"][-1]["num_updates"] == 6


GAIN = "decoder.output_projection."


def _peak_gain(state):
    """g of a saved exp-peak model by hand: exp(z_a + C m (u - u_a))."""
    u, u_a, z_a, m = (state[GAIN + name].item() for name in
                      ("gain_param", "gain_param_anchor", "gain_exponent_anchor", "gain_speedup"))
    return math.exp(z_a + 100.0 * m * (u - u_a))


def test_v070_exp_peak_checkpoint_builds_its_gain_exactly(toy_bin):
    """0.7.0's ``exp`` form with the ``peak`` schedule (both retired in 0.8.0):
    built with them, every saved tensor (the anchors and m included) as
    saved, and g = exp(z_a + C m (u - u_a)) by hand, also after the fold
    fairseq's trainer makes on loading (set_num_updates)."""
    path = V070_EXP_PEAK / "checkpoint_last.pt"
    models, cfg, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)], arg_overrides={"data": str(toy_bin)})
    saved = torch.load(path, map_location="cpu", weights_only=False)["model"]
    built = models[0].state_dict()
    assert (cfg.model.natbias_gain_form, cfg.model.natbias_gain_schedule) == ("exp", "peak")
    assert sorted(built) == sorted(saved)
    assert all(torch.equal(built[name], saved[name]) for name in saved)
    # m(3), update 4's: lr(3) = 1e-7 + 3 (1e-3 - 1e-7) / 10 of the 10-update warm-up
    assert saved[GAIN + "gain_speedup"].item() == pytest.approx(1e-3 / (1e-7 + 3 * (1e-3 - 1e-7) / 10))
    projection = models[0].decoder.output_projection
    assert projection.gain().item() == pytest.approx(_peak_gain(saved), rel=1e-6)
    models[0].set_num_updates(4)
    assert projection.gain().item() == pytest.approx(_peak_gain(saved), rel=1e-6)


@pytest.mark.parametrize("given", [[], V070_EXP_PEAK_OPTIONS], ids=["left-out", "given"])
def test_v070_exp_peak_checkpoint_resumes_on_its_schedule(toy_bin, tmp_path, given):
    """Resumed to update 6, the options left out (they follow the checkpoint)
    or given: still exp and peak, m(5) of the warm-up saved (update 6's; with
    the warm-up's start left out, fairseq's 0 gives 10 / 5), and log g moved
    at the peak schedule's speed: about C * peak lr = 0.1 an update (Adam's
    steps are about one learning rate), more than the lr schedule's
    C * (lr(4) + lr(5)) = 0.09 over the two updates could."""
    before = _peak_gain(torch.load(V070_EXP_PEAK / "checkpoint_last.pt", map_location="cpu",
                                   weights_only=False)["model"])
    log, state = _resume_fixture(V070_EXP_PEAK, toy_bin, tmp_path, *given)
    model_cfg = state["cfg"]["model"]
    assert (model_cfg.natbias_gain_form, model_cfg.natbias_gain_schedule) == ("exp", "peak")
    start = 1e-7 if given else 0.0
    assert state["model"][GAIN + "gain_speedup"].item() == pytest.approx(
        1e-3 / (start + 5 * (1e-3 - start) / 10), rel=1e-5)
    moved = abs(math.log(_peak_gain(state["model"])) - math.log(before))
    assert 0.12 < moved < 0.21


def test_v070_damped_checkpoint_resumes_with_its_own_weights(toy_bin, tmp_path):
    """0.7.0's ``damped`` init (retired in 0.8.0) recorded, resumed with the
    option left out: the model is built as saved (no init runs: the decoder's
    layer-norm gain is still the ~0.1 it trained from) and goes on training."""
    log, state = _resume_fixture(V070_DAMPED, toy_bin, tmp_path)
    assert "with its own --natbias-init unigram --natbias-weight-init damped" in log
    assert state["cfg"]["model"].natbias_weight_init == "damped"
    norm = state["model"]["decoder.layers.0.final_layer_norm.weight"]
    assert norm.max().item() < 0.2
    assert state["optimizer_history"][-1]["num_updates"] == 6


def test_v010_checkpoint_builds_its_own_model_exactly(toy_bin):
    """A checkpoint trained by 0.1.0 (default weight init ``fairseq``) is
    built with its own init: no gain, every tensor the one it saved."""
    path = V010 / "checkpoint_last.pt"
    models, cfg, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)], arg_overrides={"data": str(toy_bin)})
    saved = torch.load(path, map_location="cpu", weights_only=False)["model"]
    built = models[0].state_dict()
    assert cfg.model.natbias_weight_init == "fairseq"
    assert not [name for name, _ in models[0].named_parameters() if "gain" in name]
    assert sorted(built) == sorted(saved)
    assert all(torch.equal(built[name], saved[name]) for name in saved)


def _generate_lines(text):
    """fairseq-generate's lines, with the sentence scores of H-/D- lines and
    the positional scores of P- lines as floats: the rest (ids, tokens, BLEU)
    is compared exactly, the full-precision scores to 1e-6 and the printed
    4-decimal positional scores to one unit of their last digit."""
    lines = []
    for line in text.splitlines():
        fields = line.split("\t")
        if fields[0][:2] in ("H-", "D-"):
            lines.append((fields[0], float(fields[1]), *fields[2:]))
        elif fields[0][:2] == "P-":
            lines.append((fields[0], [float(score) for score in fields[1].split()]))
        else:
            lines.append((line,))
    return lines


@pytest.mark.parametrize("fixture", OLD_FIXTURES, ids=OLD_FIXTURE_IDS)
def test_old_checkpoint_generates_as_its_version_did(toy_bin, fixture):
    """The same translations, positional scores and BLEU line as the version
    that trained the checkpoint printed (``generate.out`` beside it). The
    full-precision sentence scores are compared to 1e-6, and the positional
    scores, printed to 4 decimals, to 1e-4, not bit for bit: their last bits
    depend on the CPU's float kernels (the v0.1.0 fixture was recorded on
    another CPU; on this one 0.1.0's own code prints the same digits as
    today's, checked by hand with a worktree of c0d37c9; on the machine of
    a later session one positional score of v0.2.0's printed -2.9169 for
    the recorded -2.9170), not on this package."""
    result = fairseq("fairseq-generate", toy_bin, "--user-dir", "fairseq_natbias",
                     "--path", fixture / "checkpoint_last.pt", *GENERATE)
    got = _generate_lines(result.stdout)
    expected = _generate_lines((fixture / "generate.out").read_text())
    assert len(got) == len(expected)
    for got_line, expected_line in zip(got, expected):
        if len(expected_line) > 2:  # an H- or D- line
            assert got_line[0] == expected_line[0] and got_line[2:] == expected_line[2:]
            assert got_line[1] == pytest.approx(expected_line[1], abs=1e-6), expected_line[0]
        elif expected_line[0][:2] == "P-":
            assert got_line[0] == expected_line[0]
            assert got_line[1] == pytest.approx(expected_line[1], abs=1.01e-4), expected_line[0]
        else:
            assert got_line == expected_line


def test_v010_checkpoint_resumes_with_its_own_weight_init(toy_bin, tmp_path):
    log, state = _resume_fixture(V010, toy_bin, tmp_path)
    assert "with its own --natbias-init unigram --natbias-weight-init fairseq" in log
    assert state["cfg"]["model"].natbias_weight_init == "fairseq"
    assert "decoder.output_projection.gain_param" not in state["model"]
    assert state["optimizer_history"][-1]["num_updates"] == 6


# --- resuming and fine-tuning with other settings --------------------------------------------


@pytest.fixture(scope="module")
def unigram_run(toy_bin, tmp_path_factory):
    """One update of the default model (unigram bias, gain init)."""
    save_dir = tmp_path_factory.mktemp("unigram_run")
    train(toy_bin, save_dir, max_update=1)
    return save_dir / "checkpoint_last.pt"


@pytest.mark.parametrize("options, asked", [
    (["--natbias-init", "zero"], "--natbias-init zero"),
    (["--natbias-init", "none"], "--natbias-init none"),
    (["--natbias-weight-init", "fairseq"], "--natbias-weight-init fairseq"),
    (["--natbias-gain-speed", "50"], "--natbias-gain-speed 50"),
    (["--natbias-gain-form", "exp"], "--natbias-gain-form exp"),
    (["--natbias-gain-form", "linear"], "--natbias-gain-form linear"),
    (["--natbias-gain-form", "capped"], "--natbias-gain-form capped"),
])
def test_resuming_with_other_settings_is_refused(toy_bin, tmp_path, unigram_run,
                                                 options, asked):
    save_dir = tmp_path / "ckpt"
    save_dir.mkdir()
    shutil.copy(unigram_run, save_dir / "checkpoint_last.pt")
    result = train(toy_bin, save_dir, *options, max_update=2, check=False)
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("fairseq_natbias: error: ")
    assert ("--natbias-init unigram --natbias-weight-init gain --natbias-gain-speed 20 "
            "--natbias-gain-form abs-capped") in message
    assert asked in message and "--save-dir" in message
    assert "Traceback" not in result.stderr


def capped_checkpoint(unigram_run, path, gain_param):
    """``unigram_run`` as 0.4.0-0.5 saved it: form ``capped`` recorded, and its
    gain parameter set to ``gain_param``."""
    state = torch.load(unigram_run, map_location="cpu", weights_only=False)
    assert state["cfg"]["model"].natbias_gain_form == "abs-capped"
    state["cfg"]["model"].natbias_gain_form = "capped"
    state["model"]["decoder.output_projection.gain_param"].fill_(gain_param)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return path


@pytest.mark.parametrize("options, replacement", [
    (["--natbias-gain-form", "capped"], "--natbias-gain-form abs-capped"),
    (["--natbias-gain-form", "linear"], "--natbias-gain-form abs-capped"),
    (["--natbias-gain-form", "exp"], "--natbias-gain-form abs-capped"),
    (["--natbias-gain-schedule", "peak"], "--natbias-gain-schedule lr"),
    (["--natbias-weight-init", "damped"], "--natbias-weight-init gain"),
], ids=["capped", "linear", "exp", "peak", "damped"])
def test_a_new_model_with_a_retired_setting_is_refused(toy_bin, tmp_path, options, replacement):
    result = train(toy_bin, tmp_path / "ckpt", *options, max_update=1, check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith(f"fairseq_natbias: error: {' '.join(options)} is retired "
                              "for new models (")
    assert f"Use {replacement} (the default)" in message
    assert "still resume, fine-tune and generate" in message
    assert not (tmp_path / "ckpt" / "checkpoint_last.pt").exists()


def test_a_retired_gain_setting_means_nothing_without_the_gain(toy_bin, tmp_path):
    """The gain's form and schedule are ignored by the inits without a gain
    (options_text leaves them out too): a new ``fairseq`` model with the
    retired ``peak`` named trains."""
    result = train(toy_bin, tmp_path / "ckpt", "--natbias-weight-init", "fairseq",
                   "--natbias-gain-schedule", "peak", max_update=1, check=False)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize("given", [[], ["--natbias-gain-form", "capped"]], ids=["left-out", "given"])
def test_a_capped_checkpoint_keeps_its_form(toy_bin, tmp_path, unigram_run, given):
    """A checkpoint that recorded ``capped`` (0.4.0-0.5) with a negative C u
    loads with g = min(C u, 1) = C u < 0, where abs-capped would give |C u|,
    and resumes with it, the option left out or given."""
    checkpoint = capped_checkpoint(unigram_run, tmp_path / "ckpt" / "checkpoint_last.pt", -0.01)
    (model,), _ = checkpoint_utils.load_model_ensemble([str(checkpoint)])
    projection = model.decoder.output_projection
    assert projection.form == "capped"
    assert projection.gain().item() == pytest.approx(20 * -0.01)  # C u, by hand
    result = train(toy_bin, tmp_path / "ckpt", *given, max_update=2)
    assert "@ 1 updates" in result.stdout + result.stderr  # resumed, not started afresh
    assert saved_model_args(checkpoint).natbias_gain_form == "capped"


@pytest.mark.parametrize("how", ["continue-once", "restore-file-with-suffix"])
def test_every_way_fairseq_resumes_is_checked(toy_bin, tmp_path, unigram_run, how):
    """fairseq loads --continue-once on a first launch, and a non-default
    --restore-file with the --checkpoint-suffix put before its .pt: a bias
    setting that disagrees with that checkpoint is refused there too."""
    save_dir = tmp_path / "ckpt"
    if how == "continue-once":
        options = ["--continue-once", unigram_run]
    else:
        shutil.copy(unigram_run, tmp_path / "start-x.pt")
        options = ["--restore-file", tmp_path / "start.pt", "--checkpoint-suffix=-x"]
    result = train(toy_bin, save_dir, "--natbias-init", "zero", *options, max_update=2,
                   check=False)
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("fairseq_natbias: error: ") and "--natbias-init zero" in message
    assert "Traceback" not in result.stderr


def test_resuming_from_a_file_that_is_no_checkpoint_says_so(toy_bin, tmp_path):
    save_dir = tmp_path / "ckpt"
    save_dir.mkdir()
    (save_dir / "checkpoint_last.pt").write_bytes(b"not a checkpoint\n" * 4)
    result = train(toy_bin, save_dir, max_update=2, check=False)
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert "checkpoint_last.pt is not a fairseq checkpoint" in message
    assert "Traceback" not in result.stderr


def test_saved_model_args_refuses_a_pickle_of_something_else(tmp_path):
    path = tmp_path / "list.pt"
    torch.save([1, 2, 3], path)
    with pytest.raises(NaturalBiasError, match="holds a list, not a fairseq checkpoint"):
        saved_model_args(str(path))


def test_resuming_with_the_same_settings_given_explicitly_works(toy_bin, tmp_path, unigram_run):
    save_dir = tmp_path / "ckpt"
    save_dir.mkdir()
    shutil.copy(unigram_run, save_dir / "checkpoint_last.pt")
    result = train(toy_bin, save_dir, "--natbias-init", "unigram",
                   "--natbias-weight-init", "gain", max_update=2)
    assert "@ 1 updates" in result.stdout + result.stderr


def test_finetuning_keeps_the_checkpoint_bias_and_says_so(toy_bin, tmp_path, unigram_run):
    result = train(toy_bin, tmp_path / "finetuned", "--natbias-init", "zero",
                   "--finetune-from-model", unigram_run, max_update=2)
    log = result.stdout + result.stderr
    assert "fine-tuning from" in log and "not re-initialised or recounted" in log
    assert "--natbias-init on the command line ignored" in log
    trained = torch.load(unigram_run, map_location="cpu")["model"]
    state = torch.load(tmp_path / "finetuned/checkpoint_last.pt", map_location="cpu")
    assert state["cfg"]["model"].natbias_init == "unigram"
    # Fine-tuning started from the trained bias (1 more update moves it a little).
    bias = state["model"]["decoder.output_projection.bias"]
    torch.testing.assert_close(bias, trained["decoder.output_projection.bias"],
                               atol=5e-3, rtol=0)


def test_resumed_run_still_generates_without_training_data(toy_bin, fresh_copy, tmp_path):
    """A checkpoint written after resuming keeps the counted marker: a model
    built from its config loads weights instead of counting."""
    data = fresh_copy(toy_bin)
    train(data, tmp_path / "ckpt", max_update=1)
    train(data, tmp_path / "ckpt", max_update=2)
    for path in data.glob("train.*"):
        path.unlink()
    moved = tmp_path / "moved.pt"
    shutil.move(tmp_path / "ckpt/checkpoint_last.pt", moved)
    shutil.rmtree(tmp_path / "ckpt")
    result = fairseq("fairseq-generate", data, "--user-dir", "fairseq_natbias",
                     "--path", moved, *GENERATE)
    assert "Translated 20 sentences" in result.stderr
