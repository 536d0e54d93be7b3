"""Checkpoints and their natural-bias settings (fairseq_natbias/checkpoints.py):
a checkpoint of a published format (1.0 on) loads, resumes and generates as the
version that wrote it printed; one of 0.x (never published, no format recorded)
is refused in one line naming 0.8.0; resuming with other settings is refused in one line, by every way
fairseq resumes; fine-tuning says what it does with the bias."""

import filecmp
import math
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from fairseq import checkpoint_utils
from natbias_testing import NO_LOADER_PROCESS, fairseq, train

from fairseq_natbias.checkpoints import saved_model_args
from natbias import FORMAT_VERSION, __version__
from natbias.errors import NaturalBiasError

FIXTURES = Path(__file__).parent / "fixtures"
V039 = FIXTURES / "v0.3.9"  # 0.3.9's uncapped linear gain (0.x: refused)
V080 = FIXTURES / "v0.8.0"  # 0.8.0's defaults (0.x: refused all the same)
V100 = FIXTURES / "v1.0.0"  # 1.0.0's defaults, with its format version
V220 = FIXTURES / "v2.2.0"  # 2.2.0's defaults, format 3
# The format each fixture records (None: before formats were recorded).
RECORDED_FORMAT = {V100: 1, V220: 3}
# The model of the fixtures (their READMEs say how they were made).
FIXTURE_MODEL = [
    "--encoder-layers",
    "1",
    "--decoder-layers",
    "1",
    "--encoder-embed-dim",
    "16",
    "--decoder-embed-dim",
    "16",
    "--encoder-ffn-embed-dim",
    "32",
    "--decoder-ffn-embed-dim",
    "32",
    "--encoder-attention-heads",
    "2",
    "--decoder-attention-heads",
    "2",
    "--share-decoder-input-output-embed",
]
GENERATE = ["--beam", "5", "--cpu", "--max-len-b", "10", "--required-batch-size-multiple", "1"]
LOADABLE = [V100, V220]


@pytest.mark.parametrize("fixture", [V039, V080, V100, V220], ids=lambda p: p.name)
def test_the_fixtures_match_the_toy_corpus(toy_bin, fixture):
    for name in ("dict.src.txt", "dict.tgt.txt"):
        assert filecmp.cmp(toy_bin / name, fixture / name, shallow=False), name


@pytest.mark.parametrize("fixture", LOADABLE, ids=lambda p: p.name)
def test_a_checkpoint_builds_its_own_model_exactly(toy_bin, fixture):
    """Every tensor as saved (format 1's 0-d gain as format 2's (1,)), the
    gain g = 20 u by hand; the format each version recorded."""
    path = fixture / "checkpoint_last.pt"
    models, cfg, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)], arg_overrides={"data": str(toy_bin)}
    )
    saved = torch.load(path, map_location="cpu", weights_only=False)
    built = models[0].state_dict()
    assert sorted(built) == sorted(saved["model"])
    scalar = "decoder.output_projection.gain_param"
    saved_shape = () if RECORDED_FORMAT[fixture] == 1 else (1,)
    assert saved["model"][scalar].shape == saved_shape and built[scalar].shape == (1,)
    for name, value in saved["model"].items():
        assert torch.equal(built[name], value.reshape(built[name].shape)), name
    u = saved["model"]["decoder.output_projection.gain_param"].item()
    assert models[0].decoder.output_projection.gain().item() == pytest.approx(20 * u, rel=1e-6)
    recorded = getattr(saved["cfg"]["model"], "natbias_format_version", None)
    assert recorded == RECORDED_FORMAT[fixture]


def _generate_lines(text):
    """fairseq-generate's lines, with the sentence scores of H-/D- lines and
    the positional scores of P- lines as floats: the rest (ids, tokens, BLEU)
    is compared exactly, the scores against a float64 scoring (below)."""
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


# A float32 forward computed with other vector kernels sums in another order:
# each sum of n terms moves by at most n u sum|terms| (Higham's gamma_n, u =
# 2^-24). The longest sums here are the feed-forward's 32 terms, and a token's
# log p passes through about 16 of them (embedding, attention, feed-forward,
# output layer and log-softmax, in 1+1 layers), each term of the size of the
# result (layer-normalised): 16 x 32 x 2^-24 = 3.1e-5 of |log p|, from the
# exact value, for each machine's float32 run, the recorded one included.
FLOAT32_RELATIVE = 16 * 32 * 2.0**-24
PRINTED = 0.5e-4  # P- lines print 4 decimals: half a unit of the last one


def _float64_scorer(checkpoint, toy_bin):
    """(source text, hypothesis text) -> log2 p of each token of the
    hypothesis and of the end of sentence: the checkpoint's model, in
    float64, teacher-forced as beam search scored them."""
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint)], arg_overrides={"data": str(toy_bin)}
    )
    model = models[0].double().eval()
    source, target = task.source_dictionary, task.target_dictionary

    def bits(source_text, hypothesis):
        tokens = [target.index(w) for w in hypothesis.split()] + [target.eos()]
        src = torch.tensor([[source.index(w) for w in source_text.split()] + [source.eos()]])
        previous = torch.tensor([[target.eos()] + tokens[:-1]])
        with torch.no_grad():
            out = model(src, torch.tensor([src.shape[1]]), previous)
            log_p = model.get_normalized_probs(out, log_probs=True)[0]
        chosen = log_p.gather(-1, torch.tensor(tokens)[:, None])[:, 0] / math.log(2)
        return chosen.tolist()  # fairseq-generate prints its scores in base 2

    return bits


def _float64_scores(bits, lines):
    """{H- line's id: ``bits`` of its hypothesis given its source (S- line)}."""
    sources = dict(line[0][2:].split("\t", 1) for line in lines if line[0][:2] == "S-")
    return {
        line[0][2:]: bits(sources[line[0][2:]], line[2]) for line in lines if line[0][:2] == "H-"
    }


def _assert_scores_are_the_models(lines, exact, printed_by):
    """Each H-/D- sentence score (the mean of its tokens' log p) and each P-
    positional score within float32's reach of the float64 scoring."""
    for line in lines:
        kind, number = line[0][:2], line[0][2:]
        if kind in ("H-", "D-"):
            expected = sum(exact[number]) / len(exact[number])
            tolerance = FLOAT32_RELATIVE * abs(expected)
            assert line[1] == pytest.approx(expected, abs=tolerance), (printed_by, line[0])
        elif kind == "P-":
            for got, expected in zip(line[1], exact[number], strict=True):
                tolerance = FLOAT32_RELATIVE * abs(expected) + PRINTED
                assert got == pytest.approx(expected, abs=tolerance), (printed_by, line[0])


def _bleu(lines):
    """fairseq-generate's BLEU line computed here from its D- and T- lines:
    corpus BLEU-4 over space-split tokens (Papineni et al., 2002), as
    fairseq's scorer counts them; the line's numbers rounded as it prints."""
    hypotheses = {line[0][2:]: line[2].split() for line in lines if line[0][:2] == "D-"}
    references = {
        line[0].split("\t")[0][2:]: line[0].split("\t")[1].split()
        for line in lines
        if line[0][:2] == "T-"
    }
    matches, totals = [0] * 4, [0] * 4
    for number, hypothesis in hypotheses.items():
        reference = references[number]
        for n in range(1, 5):
            grams = Counter(tuple(hypothesis[i : i + n]) for i in range(len(hypothesis) - n + 1))
            ref = Counter(tuple(reference[i : i + n]) for i in range(len(reference) - n + 1))
            matches[n - 1] += sum(min(c, ref[g]) for g, c in grams.items())
            totals[n - 1] += max(len(hypothesis) - n + 1, 0)
    syslen = sum(len(h) for h in hypotheses.values())
    reflen = sum(len(references[number]) for number in hypotheses)
    precisions = [m / t for m, t in zip(matches, totals)]
    brevity = min(1.0, math.exp(1 - reflen / syslen))
    score = brevity * math.exp(sum(math.log(p) for p in precisions) / 4)
    return (
        f"BLEU4 = {100 * score:.2f}, "
        + "/".join(f"{100 * p:.1f}" for p in precisions)
        + f" (BP={brevity:.3f}, ratio={syslen / reflen:.3f}, syslen={syslen}, reflen={reflen})"
    )


def _compare_with_ties(got, expected, bits):
    """``got`` (fairseq-generate's lines now) against ``expected`` (the
    recorded ones): the same lines, each hypothesis the same or, where beam
    search met a near tie that another machine's float32 rounding broke the
    other way, one that the model scores as high within that rounding (the
    float64 scores of the two, each run's float32 off by FLOAT32_RELATIVE);
    the BLEU lines each the BLEU of their own hypotheses (``_bleu``)."""
    assert len(got) == len(expected)
    sources = dict(line[0][2:].split("\t", 1) for line in expected if line[0][:2] == "S-")
    for got_line, expected_line in zip(got, expected):
        if expected_line[0].startswith("Generate test with beam="):
            beam, _, recorded = expected_line[0].partition(": ")
            assert got_line[0] == f"{beam}: {_bleu(got)}"
            assert recorded == _bleu(expected)
        elif len(expected_line) > 2:  # an H- or D- line: the hypothesis
            assert got_line[0] == expected_line[0]
            if got_line[2:] != expected_line[2:]:
                number = expected_line[0][2:]
                now, then = (bits(sources[number], line[2]) for line in (got_line, expected_line))
                now, then = sum(now) / len(now), sum(then) / len(then)
                tie = 2 * FLOAT32_RELATIVE * abs(then)
                assert now == pytest.approx(then, abs=tie), (
                    "not a near tie",
                    got_line,
                    expected_line,
                )
        elif expected_line[0][:2] == "P-":
            assert got_line[0] == expected_line[0]
        else:
            assert got_line == expected_line


@pytest.mark.parametrize("fixture", LOADABLE, ids=lambda p: p.name)
def test_a_checkpoint_generates_as_its_version_did(toy_bin, fixture):
    """The same translations and BLEU line as the version that trained the
    checkpoint printed (``generate.out`` beside it), or where beam search
    met a near tie, a translation the model scores as high within float32's
    rounding; its scores, and those printed now, are each the model's own,
    scored in float64 here, within the float32 rounding of a run on any CPU
    (FLOAT32_RELATIVE): a recorded number is not compared with one
    machine's last bits."""
    result = fairseq(
        "fairseq-generate",
        *NO_LOADER_PROCESS,
        toy_bin,
        "--user-dir",
        "fairseq_natbias",
        "--path",
        fixture / "checkpoint_last.pt",
        *GENERATE,
    )
    got = _generate_lines(result.stdout)
    expected = _generate_lines((fixture / "generate.out").read_text())
    bits = _float64_scorer(fixture / "checkpoint_last.pt", toy_bin)
    _compare_with_ties(got, expected, bits)
    exact = _float64_scores(bits, expected)
    assert len(exact) == sum(line[0][:2] == "H-" for line in expected) > 0
    _assert_scores_are_the_models(expected, exact, "the version that trained it")
    _assert_scores_are_the_models(got, _float64_scores(bits, got), "this version")


def _resume_fixture(fixture, toy_bin, tmp_path, *options):
    """fairseq-train resumes the fixture's checkpoint (4 updates) to update 6,
    with ``options`` besides the fixture's model; returns the log and the
    checkpoint it wrote."""
    save_dir = tmp_path / "ckpt"
    save_dir.mkdir()
    shutil.copy(fixture / "checkpoint_last.pt", save_dir / "checkpoint_last.pt")
    result = train(toy_bin, save_dir, *FIXTURE_MODEL, *options, model=[], max_update=6)
    log = result.stdout + result.stderr
    assert "@ 4 updates" in log  # really resumed
    return log, torch.load(save_dir / "checkpoint_last.pt", map_location="cpu")


@pytest.mark.parametrize("fixture", LOADABLE, ids=lambda p: p.name)
@pytest.mark.training
def test_a_checkpoint_resumes_and_then_records_the_format(toy_bin, tmp_path, fixture):
    _, state = _resume_fixture(fixture, toy_bin, tmp_path)
    assert state["optimizer_history"][-1]["num_updates"] == 6
    assert state["cfg"]["model"].natbias_format_version == FORMAT_VERSION
    assert state["model"]["decoder.output_projection.gain_param"].shape == (1,)
    assert 0 < 20 * state["model"]["decoder.output_projection.gain_param"].item() < 1


@pytest.mark.parametrize("fixture", [V039, V080], ids=lambda p: p.name)
@pytest.mark.training
def test_a_0x_checkpoint_is_refused_in_one_line_naming_080(toy_bin, tmp_path, fixture):
    """Compatibility starts at 1.0: generating and resuming both refuse 0.x's
    checkpoints, whatever their settings (0.3.9's retired gain, 0.8.0's defaults)."""
    path = fixture / "checkpoint_last.pt"
    expected = (
        "was written by fairseq-natbias 0.x, before 1.0's checkpoint format: "
        "read it with fairseq-natbias 0.8.0, the last version that does"
    )
    result = fairseq(
        "fairseq-generate",
        *NO_LOADER_PROCESS,
        toy_bin,
        "--user-dir",
        "fairseq_natbias",
        "--path",
        path,
        *GENERATE,
        check=False,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"fairseq-generate: error: this checkpoint {expected}"
    )
    save_dir = tmp_path / "ckpt"
    save_dir.mkdir()
    shutil.copy(path, save_dir / "checkpoint_last.pt")
    result = train(toy_bin, save_dir, *FIXTURE_MODEL, model=[], max_update=6, check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].endswith(expected)


def test_a_checkpoint_of_a_newer_format_is_refused(toy_bin, tmp_path):
    state = torch.load(V100 / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    state["cfg"]["model"].natbias_format_version = FORMAT_VERSION + 1
    path = tmp_path / "newer.pt"
    torch.save(state, path)
    result = fairseq(
        "fairseq-generate",
        *NO_LOADER_PROCESS,
        toy_bin,
        "--user-dir",
        "fairseq_natbias",
        "--path",
        path,
        *GENERATE,
        check=False,
    )
    assert result.returncode != 0
    assert (
        f"records natural-bias format {FORMAT_VERSION + 1}; natbias {__version__} "
        f"reads format {FORMAT_VERSION} and earlier: upgrade natbias to load it"
        in result.stderr.strip().splitlines()[-1]
    )


# --- resuming and fine-tuning with other settings --------------------------------------------


@pytest.fixture(scope="module")
def unigram_run(toy_bin, tmp_path_factory):
    """One update of the default model (unigram bias, gain init)."""
    save_dir = tmp_path_factory.mktemp("unigram_run")
    train(toy_bin, save_dir, max_update=1)
    return save_dir / "checkpoint_last.pt"


@pytest.mark.parametrize(
    "options, asked",
    [
        (["--natbias-init", "zero"], "--natbias-init zero"),
        (["--natbias-init", "none"], "--natbias-init none"),
        (["--natbias-weight-init", "fairseq"], "--natbias-weight-init fairseq"),
        (["--natbias-gain-speed", "50"], "--natbias-gain-speed 50"),
    ],
)
@pytest.mark.training
def test_resuming_with_other_settings_is_refused(toy_bin, tmp_path, unigram_run, options, asked):
    save_dir = tmp_path / "ckpt"
    save_dir.mkdir()
    shutil.copy(unigram_run, save_dir / "checkpoint_last.pt")
    result = train(toy_bin, save_dir, *options, max_update=2, check=False)
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("fairseq-train: error: ")
    assert "--natbias-init unigram --natbias-weight-init gain --natbias-gain-speed 20" in message
    assert asked in message and "--save-dir" in message
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("how", ["continue-once", "restore-file-with-suffix"])
@pytest.mark.training
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
    result = train(toy_bin, save_dir, "--natbias-init", "zero", *options, max_update=2, check=False)
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("fairseq-train: error: ") and "--natbias-init zero" in message
    assert "Traceback" not in result.stderr


@pytest.mark.training
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


@pytest.mark.training
def test_resuming_with_the_same_settings_given_explicitly_works(toy_bin, tmp_path, unigram_run):
    save_dir = tmp_path / "ckpt"
    save_dir.mkdir()
    shutil.copy(unigram_run, save_dir / "checkpoint_last.pt")
    result = train(
        toy_bin,
        save_dir,
        "--natbias-init",
        "unigram",
        "--natbias-weight-init",
        "gain",
        max_update=2,
    )
    assert "@ 1 updates" in result.stdout + result.stderr


@pytest.mark.training
def test_finetuning_keeps_the_checkpoint_bias_and_says_so(toy_bin, tmp_path, unigram_run):
    """Fine-tuning a unigram checkpoint: an explicit --natbias-init zero is
    refused (never overridden); left at its default, the checkpoint's is taken."""
    finetune = ["--finetune-from-model", unigram_run]
    refused = train(toy_bin, tmp_path / "zero", "--natbias-init", "zero", *finetune, check=False)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    message = refused.stderr.strip().splitlines()[-1]
    assert message.startswith("fairseq-train: error: ") and "--natbias-init zero" in message
    assert "drop those options" in message
    result = train(toy_bin, tmp_path / "finetuned", *finetune, max_update=2)
    log = result.stdout + result.stderr
    assert "fine-tuning from" in log and "not re-initialised or recounted" in log
    trained = torch.load(unigram_run, map_location="cpu")["model"]
    state = torch.load(tmp_path / "finetuned/checkpoint_last.pt", map_location="cpu")
    assert state["cfg"]["model"].natbias_init == "unigram"
    # Fine-tuning started from the trained bias (1 more update moves it a little).
    bias = state["model"]["decoder.output_projection.bias"]
    torch.testing.assert_close(bias, trained["decoder.output_projection.bias"], atol=5e-3, rtol=0)


@pytest.mark.training
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
    result = fairseq(
        "fairseq-generate",
        *NO_LOADER_PROCESS,
        data,
        "--user-dir",
        "fairseq_natbias",
        "--path",
        moved,
        *GENERATE,
    )
    assert "Translated 20 sentences" in result.stderr
