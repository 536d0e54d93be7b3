"""Generation-time control of the frequency bias: logits W phi + lambda b -
tau log p_unigram, set through fairseq's --model-overrides, and examples/paper/sweep.py."""

import math
import sys
from collections import Counter

import numpy as np
import pytest
import sweep as sweep_cli
import torch
import torch.nn.functional as F
from natbias_testing import (
    NO_LOADER_PROCESS,
    console_script_help,
    fairseq,
    load_fairseq_model,
    script_python,
    train,
)

GENERATE_ARGS = ["--beam", "2", "--batch-size", "20", "--max-len-a", "0", "--max-len-b", "12"]


@pytest.fixture(scope="session")
def unigram_checkpoint(toy_bin, tmp_path_factory):
    """A few updates with the log-unigram bias held fixed: b = log p_unigram."""
    save_dir = tmp_path_factory.mktemp("control_model")
    train(toy_bin, save_dir, "--natbias-init", "unigram", "--natbias-freeze", max_update=4)
    return save_dir / "checkpoint_last.pt"


def _test_batch(task):
    task.load_dataset("test")
    return next(
        iter(
            task.get_batch_iterator(
                dataset=task.dataset("test"), max_sentences=20, required_batch_size_multiple=1
            ).next_epoch_itr(shuffle=False)
        )
    )


def _contextual_logits(model, sample):
    """g W phi computed by hand: the decoder's features times W, no bias, times
    the gain g = min(|speed * u|, 1) (the default weight init ``gain``, form
    ``abs-capped``)."""
    net_input = sample["net_input"]
    encoder_out = model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
    features, _ = model.decoder(
        net_input["prev_output_tokens"], encoder_out=encoder_out, features_only=True
    )
    projection = model.decoder.output_projection
    gain = min(abs(projection.gain_param.item() * model.args.natbias_gain_speed), 1.0)
    return gain * F.linear(features, projection.weight)


@torch.no_grad()
@pytest.mark.training
def test_overrides_reach_the_model_and_act_on_the_logits(unigram_checkpoint, toy_bin):
    plain, task = load_fairseq_model(unigram_checkpoint, toy_bin)
    sample = _test_batch(task)
    bias = plain.decoder.output_projection.bias
    log_u = plain.target_log_unigram
    assert torch.equal(bias, log_u)  # frozen: the bias is the log-unigram itself
    w_phi = _contextual_logits(plain, sample)
    for overrides, logits in (
        ({}, w_phi + bias),
        ({"natbias_bias_scale": 0.0}, w_phi),
        (
            {"natbias_bias_scale": 0.5, "natbias_logit_adjustment": 0.3},
            w_phi + 0.5 * bias - 0.3 * log_u,
        ),
        ({"natbias_bias_scale": 1.0, "natbias_logit_adjustment": 1.0}, w_phi),
    ):
        model, _ = load_fairseq_model(unigram_checkpoint, toy_bin, **overrides)
        scores = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
        torch.testing.assert_close(scores, F.log_softmax(logits, dim=-1), atol=1e-5, rtol=1e-5)


@torch.no_grad()
@pytest.mark.training
def test_lambda_zero_on_a_unigram_model_is_the_model_without_bias(
    unigram_checkpoint, toy_bin, tmp_path
):
    """The same weights saved as a --natbias-init none model (no bias at all)
    score every token as lambda = 0 does."""
    state = torch.load(unigram_checkpoint, map_location="cpu")
    del state["model"]["decoder.output_projection.bias"]
    state["cfg"]["model"].natbias_init = "none"
    torch.save(state, tmp_path / "none_like.pt")
    none_like, task = load_fairseq_model(tmp_path / "none_like.pt", toy_bin)
    assert none_like.decoder.output_projection.bias is None
    lambda_zero, _ = load_fairseq_model(unigram_checkpoint, toy_bin, natbias_bias_scale=0.0)
    sample = _test_batch(task)
    torch.testing.assert_close(
        lambda_zero.get_normalized_probs(lambda_zero(**sample["net_input"]), log_probs=True),
        none_like.get_normalized_probs(none_like(**sample["net_input"]), log_probs=True),
    )


@pytest.mark.training
def test_the_settings_are_refused_in_training_and_never_saved(unigram_checkpoint, toy_bin, capsys):
    from fairseq import options

    saved_model_cfg = torch.load(unigram_checkpoint, map_location="cpu")["cfg"]["model"]
    assert not hasattr(saved_model_cfg, "natbias_bias_scale")
    assert not hasattr(saved_model_cfg, "natbias_logit_adjustment")
    with pytest.raises(SystemExit):  # fairseq-train's own command-line parsing
        options.parse_args_and_arch(
            options.get_training_parser(),
            [
                str(toy_bin),
                "--arch",
                "transformer_natbias",  # registered on import
                "--natbias-bias-scale",
                "0.5",
            ],
        )
    assert "unrecognized arguments: --natbias-bias-scale 0.5" in capsys.readouterr().err
    model, task = load_fairseq_model(unigram_checkpoint, toy_bin, natbias_bias_scale=0.5)
    model.train()
    with pytest.raises(ValueError, match="generation-time settings"):
        model.get_normalized_probs(model(**_test_batch(task)["net_input"]), log_probs=True)


def _model_lines(path):
    """The H, D and P lines of a fairseq-generate output (per sentence id)."""
    return sorted(line for line in path.read_text().splitlines() if line[:2] in ("H-", "D-", "P-"))


def _distinct(texts, n):
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    grams = Counter()
    for text in texts:
        words = Tokenizer13a()(text).split()
        grams.update(tuple(words[i : i + n]) for i in range(len(words) - n + 1))
    total = sum(grams.values())
    return len(grams) / total if total else math.nan


def _independent_scores(output):
    """BLEU, chrF and D_1..D_4 of one fairseq-generate output, computed here."""
    from sacrebleu.metrics import BLEU, CHRF

    lines = output.read_text().splitlines()
    hyps = dict(line.split("\t")[0:3:2] for line in lines if line.startswith("D-"))
    refs = dict(line.split("\t") for line in lines if line.startswith("T-"))
    ids = sorted(refs)
    hyp_texts, ref_texts = [hyps["D" + i[1:]] for i in ids], [refs[i] for i in ids]
    return {
        "sentences": len(ids),
        "BLEU": BLEU().corpus_score(hyp_texts, [ref_texts]).score,
        "chrF": CHRF().corpus_score(hyp_texts, [ref_texts]).score,
        **{f"D{n}": _distinct(hyp_texts, n) for n in range(1, 5)},
    }


def _run_plain_generate_and_sweep(checkpoint, data, plain, out):
    def plain_generate():
        result = fairseq(
            "fairseq-generate",
            *NO_LOADER_PROCESS,
            data,
            "--path",
            checkpoint,
            "--user-dir",
            "fairseq_natbias",
            "--required-batch-size-multiple",
            "1",
            *GENERATE_ARGS,
        )
        plain.write_text(result.stdout)

    def run_sweep():
        sweep_cli.main(
            [
                str(data),
                str(checkpoint),
                "--lambdas",
                "0",
                "1",
                "--out-dir",
                str(out),
                "--",
                *GENERATE_ARGS,
            ]
        )

    plain_generate()
    run_sweep()


@pytest.mark.training
def test_sweep_runs_fairseq_generate_and_reports_quality_and_diversity(
    unigram_checkpoint, toy_bin, tmp_path, capsys, monkeypatch
):
    out, plain = tmp_path / "sweep", tmp_path / "plain.txt"
    # sweep.py runs the fairseq-generate beside sys.executable: the fork server's
    monkeypatch.setattr(sys, "executable", script_python())
    _run_plain_generate_and_sweep(unigram_checkpoint, toy_bin, plain, out)
    assert "sacreBLEU BLEU signature: `nrefs:1|case:mixed" in capsys.readouterr().out
    as_trained = out / "generate.lambda1.tau0.txt"
    assert _model_lines(as_trained) == _model_lines(plain)  # lambda 1, tau 0: plain fairseq
    assert _model_lines(out / "generate.lambda0.tau0.txt") != _model_lines(plain)

    rows = [line.split("\t") for line in (out / "sweep.tsv").read_text().splitlines()]
    assert rows[0][:9] == ["lambda", "tau", "BLEU", "chrF", "D1", "D2", "D3", "D4", "D"]
    table = {row[0]: dict(zip(rows[0], row)) for row in rows[1:]}
    for lam in ("0", "1"):
        expected, row = _independent_scores(out / f"generate.lambda{lam}.tau0.txt"), table[lam]
        assert int(row["sentences"]) == expected["sentences"] == 20  # none dropped
        for key in ("BLEU", "chrF"):
            assert float(row[key]) == pytest.approx(expected[key], abs=0.006)
        distinct = [expected[f"D{n}"] for n in range(1, 5)]
        for n, value in enumerate(distinct, start=1):
            cell = row[f"D{n}"]
            assert (
                (cell == "n/a")
                if math.isnan(value)
                else float(cell) == pytest.approx(value, abs=6e-5)
            )
        if not any(math.isnan(v) for v in distinct):
            assert float(row["D"]) == pytest.approx(np.mean(distinct), abs=6e-5)
    assert (out / "sweep.png").stat().st_size > 10_000


def _empty_split(data_dir):
    from fairseq.data import indexed_dataset

    for side in ("src", "tgt"):
        prefix = data_dir / f"test.src-tgt.{side}"
        indexed_dataset.MMapIndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16).finalize(
            f"{prefix}.idx"
        )


@pytest.mark.training
def test_sweep_refuses_bad_settings_and_an_empty_test_set(
    unigram_checkpoint, toy_bin, fresh_copy, tmp_path
):
    with pytest.raises(SystemExit, match=r"lambda = 1.5: the bias scale must lie in \[0, 1\]"):
        sweep_cli.main(
            [str(toy_bin), str(unigram_checkpoint), "--lambdas", "1.5", "--out-dir", str(tmp_path)]
        )
    with pytest.raises(SystemExit, match="sets --model-overrides itself"):
        sweep_cli.main(
            [
                str(toy_bin),
                str(unigram_checkpoint),
                "--out-dir",
                str(tmp_path),
                "--",
                "--model-overrides",
                "{}",
            ]
        )
    # A dictionary given for the checkpoint: refused before any fairseq-generate
    # (0.7.0 relayed that process's traceback).
    with pytest.raises(
        SystemExit,
        match=r"examples/paper/sweep.py: error: .*dict.tgt.txt is not a fairseq "
        r"checkpoint \(not a torch.save archive\)",
    ):
        sweep_cli.main([str(toy_bin), str(toy_bin / "dict.tgt.txt"), "--out-dir", str(tmp_path)])
    assert not list(tmp_path.glob("generate.*"))
    data = fresh_copy(toy_bin)
    _empty_split(data)
    with pytest.raises(
        SystemExit, match="examples/paper/sweep.py: error: the test split of .* is empty"
    ):
        sweep_cli.main([str(data), str(unigram_checkpoint), "--out-dir", str(tmp_path)])
    assert sweep_cli.has_output_bias(str(unigram_checkpoint)) is True


def test_console_script_help():
    """The installed script runs this package's main; --help describes the tool."""
    assert "natbias_logit_adjustment" in console_script_help("examples/paper/sweep.py")
