"""examples/paper/sweep_lm.py: Kobayashi et al.'s
lambda sweep for a language model, each measure checked against an
independent computation (fairseq-eval-lm, sacreBLEU, distinct-n recounted)."""

import re

import pytest
from natbias_testing import NO_LOADER_PROCESS, fairseq, sacrebleu_scores, train, train_lm


@pytest.fixture(scope="module")
def lm_checkpoint(toy_lm_bin, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("sweep_lm_model")
    train_lm(toy_lm_bin, save_dir, max_update=6)
    return save_dir / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def swept(lm_checkpoint, toy_lm_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep_lm")
    result = fairseq(
        "examples/paper/sweep_lm.py",
        toy_lm_bin,
        lm_checkpoint,
        "--lambdas",
        "0",
        "1",
        "--prompt-tokens",
        "2",
        "--max-continuation",
        "8",
        "--out-dir",
        out,
    )
    rows = {}
    for line in (out / "sweep_lm.tsv").read_text().splitlines()[1:]:
        values = line.split("\t")
        rows[float(values[0])] = dict(
            zip(
                (
                    "lambda",
                    "tau",
                    "ref_nll",
                    "chrF",
                    "BLEU",
                    "D1",
                    "D2",
                    "D3",
                    "D4",
                    "D",
                    "sentences",
                    "mean_length",
                ),
                values,
            )
        )
    return out, rows, result


def eval_lm_bits(data, checkpoint, *overrides):
    """fairseq-eval-lm's loss (base 2) with one sentence per sample."""
    result = fairseq(
        "fairseq-eval-lm",
        *NO_LOADER_PROCESS,
        data,
        "--user-dir",
        "fairseq_natbias",
        "--path",
        checkpoint,
        "--cpu",
        "--gen-subset",
        "test",
        "--sample-break-mode",
        "eos",
        "--max-tokens",
        "1024",
        *overrides,
    )
    return float(re.search(r"Loss \(base 2\): ([\d.]+)", result.stderr + result.stdout)[1])


@pytest.mark.training
def test_reference_nll_is_what_fairseq_eval_lm_reports(swept, toy_lm_bin, lm_checkpoint):
    _, rows, _ = swept
    assert float(rows[1.0]["ref_nll"]) == pytest.approx(
        eval_lm_bits(toy_lm_bin, lm_checkpoint), abs=1e-3
    )
    assert float(rows[0.0]["ref_nll"]) == pytest.approx(
        eval_lm_bits(toy_lm_bin, lm_checkpoint, "--model-overrides", "{'natbias_bias_scale': 0.0}"),
        abs=1e-3,
    )


def distinct_by_hand(texts, max_n=4):
    """D_1..D_max_n (eq. 5), counted here: the distinct n-grams over all
    n-grams of the texts' sacreBLEU 13a tokens."""
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    token_lists = [Tokenizer13a()(text).split() for text in texts]
    shares = []
    for n in range(1, max_n + 1):
        grams = [tuple(t[i : i + n]) for t in token_lists for i in range(len(t) - n + 1)]
        shares.append(len(set(grams)) / len(grams))
    return shares


@pytest.mark.training
def test_diversity_and_chrf_recomputed_from_the_continuations(swept):
    """D1-D4, D and chrF of each lambda's continuations: counted here and
    sacreBLEU's own chrF (not the library's distinct nor the examples' quality)."""
    out, rows, _ = swept
    for lam in (0.0, 1.0):
        lines = (out / f"continuations.sample.lambda{lam:g}.tau0.txt").read_text().splitlines()
        triples = [line.split("\t") for line in lines]
        assert len(triples) == int(rows[lam]["sentences"]) > 0
        continuations = [t[1] for t in triples]
        shares = distinct_by_hand(continuations)
        for n, share in enumerate(shares, start=1):
            assert float(rows[lam][f"D{n}"]) == pytest.approx(share, abs=1e-4), n
        assert float(rows[lam]["D"]) == pytest.approx(sum(shares) / len(shares), abs=1e-4)
        _, chrf = sacrebleu_scores(continuations, [t[2] for t in triples])
        assert float(rows[lam]["chrF"]) == pytest.approx(chrf, abs=0.01)
        assert all(len(t[0].split()) == 2 for t in triples)  # the prompt: 2 tokens


@pytest.mark.training
def test_outputs_and_signatures(swept):
    out, _, result = swept
    table = (out / "sweep_lm.md").read_text()
    assert "nrefs:1|case:mixed|eff:yes|nc:6" in table  # chrF signature
    assert (out / "sweep_lm.png").stat().st_size > 5000
    assert "wrote" in result.stdout


@pytest.mark.training
def test_sampling_is_seeded(lm_checkpoint, toy_lm_bin, tmp_path):
    texts = []
    for name in ("a", "b"):
        fairseq(
            "examples/paper/sweep_lm.py",
            toy_lm_bin,
            lm_checkpoint,
            "--lambdas",
            "1",
            "--prompt-tokens",
            "2",
            "--max-continuation",
            "5",
            "--out-dir",
            tmp_path / name,
        )
        texts.append((tmp_path / name / "continuations.sample.lambda1.tau0.txt").read_text())
    assert texts[0] == texts[1]


@pytest.mark.training
def test_a_translation_checkpoint_is_refused_in_one_line(toy_bin, toy_lm_bin, tmp_path):
    train(toy_bin, tmp_path / "mt", max_update=1)
    result = fairseq(
        "examples/paper/sweep_lm.py",
        toy_lm_bin,
        tmp_path / "mt/checkpoint_last.pt",
        "--out-dir",
        tmp_path / "out",
        check=False,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("examples/paper/sweep_lm.py: error:")


@pytest.mark.training
def test_missing_files_are_named(lm_checkpoint, toy_bin, tmp_path):
    missing = fairseq(
        "examples/paper/sweep_lm.py",
        toy_bin,
        tmp_path / "nope.pt",
        "--out-dir",
        tmp_path / "out",
        check=False,
    )
    assert "nope.pt: no such checkpoint" in missing.stderr
    no_dict = fairseq(
        "examples/paper/sweep_lm.py",
        toy_bin,
        lm_checkpoint,
        "--out-dir",
        tmp_path / "out",
        check=False,
    )
    assert "has no dict.txt" in no_dict.stderr and "Traceback" not in no_dict.stderr


@pytest.mark.training
def test_beam_search_continuations(lm_checkpoint, toy_lm_bin, tmp_path):
    """Beam search (deterministic: two runs agree) with only dict.txt and the
    test split beside the checkpoint."""
    data = tmp_path / "data"
    data.mkdir()
    for name in ("dict.txt", "test.bin", "test.idx"):
        (data / name).write_bytes((toy_lm_bin / name).read_bytes())
    outputs = []
    for run in ("a", "b"):
        fairseq(
            "examples/paper/sweep_lm.py",
            data,
            lm_checkpoint,
            "--lambdas",
            "0.5",
            "--decoding",
            "beam",
            "--beam",
            "3",
            "--prompt-tokens",
            "2",
            "--max-continuation",
            "6",
            "--out-dir",
            tmp_path / run,
        )
        outputs.append((tmp_path / run / "continuations.beam.lambda0.5.tau0.txt").read_text())
    assert outputs[0] == outputs[1] and outputs[0].strip()
