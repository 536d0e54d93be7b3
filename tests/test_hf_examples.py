"""examples/huggingface on a slice of Multi30k with tiny settings: translate.py
(stock and the natural bias), language_model.py and report.py, as a user runs
them (subprocesses), a finished run skipped when run again."""

import json
import math
import os
import subprocess

import numpy as np
import pytest
from natbias_testing import REPO, sacrebleu_scores, script_path, script_python, write_multi30k_slice

pytest.importorskip("transformers")

EXAMPLE = REPO / "examples" / "huggingface"
TINY = [
    "--vocab",
    "300",
    "--layers",
    "1",
    "--dim",
    "16",
    "--ffn",
    "32",
    "--heads",
    "2",
    "--max-steps",
    "6",
    "--eval-every",
    "3",
    "--batch-size",
    "16",
    "--warmup",
    "2",
]


def run(script, *args):
    done = subprocess.run(
        [script_python(), str(EXAMPLE / script), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def translations(tmp_path_factory):
    data = write_multi30k_slice(
        tmp_path_factory.mktemp("slice"), {"train": 400, "val": 20, "test_2016_flickr": 12}
    )
    work = tmp_path_factory.mktemp("hf")
    for bias in ("none", "natural"):
        run("translate.py", "--data", data, "--work", work, "--bias", bias, *TINY)
    return data, work


@pytest.mark.training
def test_each_arm_records_its_curve_and_scores(translations):
    data, work = translations
    references = [line.strip() for line in (data / "test_2016_flickr.en").read_text().splitlines()]
    records = {
        arm: json.loads((work / "runs" / arm / "seed1" / "record.json").read_text())
        for arm in ("stock", "natbias")
    }
    for arm, record in records.items():
        assert record["updates"] == [0, 3, 6]
        assert record["best_nll"] == min(record["nll"])
        scores = record["scores"]["test"]
        assert scores["bleu_signature"].startswith("nrefs:1|case:mixed")
        # the hypotheses written, against the slice's English in order, as sacreBLEU scores them
        hypotheses = (work / "runs" / arm / "seed1" / "test.hyp").read_text().splitlines()
        assert len(hypotheses) == len(references)
        bleu, chrf = sacrebleu_scores(hypotheses, references)
        assert (scores["BLEU"], scores["chrF"]) == pytest.approx((bleu, chrf), abs=1e-9)
    # Update 0: the natural bias predicts the prior (the unigram's cross-entropy),
    # transformers' stock model about the uniform (log2 of the vocabulary).
    # That cross-entropy counted here, in float64: the English lines encoded
    # by the run's tokenizer (each ending in </s>), np.bincount, add-one
    # smoothing (the default) written out.
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(work / "tokenizer")

    def target_counts(split):
        lines = [line.strip() for line in (data / f"{split}.en").read_text().splitlines()]
        ids = [i for line in lines for i in tokenizer(line)["input_ids"]]
        return np.bincount(ids, minlength=len(tokenizer)).astype(np.float64)

    train, valid = target_counts("train"), target_counts("val")
    log_unigram = np.log((train + 1.0) / (train.sum() + len(train)))
    unigram_bits = -(valid * log_unigram).sum() / valid.sum() / math.log(2)
    natbias, stock = records["natbias"], records["stock"]
    assert natbias["unigram_nll"] == pytest.approx(unigram_bits, abs=5e-5)  # 4 decimals
    assert abs(natbias["nll"][0] - unigram_bits) < 0.05
    assert stock["nll"][0] > natbias["nll"][0] + 1.0
    assert (work / "runs/natbias/seed1/best/config.json").exists()
    log_keys = set().union(*natbias["log_history"])
    assert {"bias_kl", "gain", "kl_unigram"} <= log_keys


@pytest.mark.training
def test_a_finished_run_is_skipped(translations):
    data, work = translations
    again = run("translate.py", "--data", data, "--work", work, "--bias", "natural", *TINY)
    assert "done before, skipped" in again


@pytest.mark.training
def test_the_report_compares_the_arms_with_stock(translations, tmp_path):
    _, work = translations
    out = tmp_path / "report.md"
    printed = run("report.py", work, "--out", out)
    assert printed.strip() == out.read_text().strip()
    rows = [
        line
        for line in printed.splitlines()
        if line.startswith("| natbias") or line.startswith("| stock")
    ]
    assert len(rows) == 3 and rows[0].startswith("| stock") and rows[1].startswith("| natbias |")
    # The paired row: natbias against stock, seed 1, best NLL and BLEU differences.
    record = {
        arm: json.loads((work / "runs" / arm / "seed1" / "record.json").read_text())
        for arm in ("stock", "natbias")
    }
    best = round(record["natbias"]["best_nll"] - record["stock"]["best_nll"], 3) + 0.0
    bleu = record["natbias"]["scores"]["test"]["BLEU"] - record["stock"]["scores"]["test"]["BLEU"]
    bleu = round(bleu, 2) + 0.0  # + 0.0: "+0.00", not "-0.00", as the report prints it
    assert rows[2].startswith(f"| natbias | stock | 1 | {best:+.3f} | {bleu:+.2f} |")
    assert "sacreBLEU: nrefs:1" in printed
    assert (tmp_path / f"report_{work.name}_valid_nll.png").stat().st_size > 5000


@pytest.mark.training
def test_the_language_model_example(translations, tmp_path):
    data, _ = translations
    output = run(
        "language_model.py",
        "--data",
        data,
        "--lang",
        "en",
        "--work",
        tmp_path,
        "--vocab",
        "300",
        "--layers",
        "1",
        "--dim",
        "16",
        "--ffn",
        "32",
        "--heads",
        "2",
        "--block",
        "16",
        "--batch-size",
        "4",
        "--max-steps",
        "4",
        "--eval-every",
        "2",
    )
    record = json.loads((tmp_path / "runs/natbias/seed1/record.json").read_text())
    # The unigram's cross-entropy counted here, in float64: each split's lines
    # encoded by the run's tokenizer as one stream, cut into blocks of 16 (the
    # last partial one dropped), every token but a block's first a target;
    # np.bincount, add-one smoothing written out.
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(tmp_path / "tokenizer")

    def target_counts(split):
        lines = [line.strip() for line in (data / f"{split}.en").read_text().splitlines()]
        stream = [i for line in lines for i in tokenizer(line)["input_ids"]]
        targets = [
            i for start in range(0, len(stream) - 15, 16) for i in stream[start + 1 : start + 16]
        ]
        return np.bincount(targets, minlength=len(tokenizer)).astype(np.float64)

    train, valid = target_counts("train"), target_counts("val")
    log_unigram = np.log((train + 1.0) / (train.sum() + len(train)))
    unigram_bits = -(valid * log_unigram).sum() / valid.sum() / math.log(2)
    assert record["unigram_nll"] == pytest.approx(unigram_bits, abs=5e-5)  # 4 decimals
    assert abs(record["nll"][0] - unigram_bits) < 0.05
    assert record["scores"]["test"]["ppl"] == pytest.approx(
        2 ** record["scores"]["test"]["nll"], rel=1e-3
    )
    assert "perplexity" in output


@pytest.mark.training
def test_run_sh_trains_the_arms_it_is_given_and_reports(translations, tmp_path):
    data, _ = translations
    settings = dict(
        DATA=data,
        TEST="test_2016_flickr",
        WORK=tmp_path / "work",
        ARMS="stock+unigram-ls",
        VOCAB=300,
        LAYERS=1,
        DIM=16,
        FFN=32,
        HEADS=2,
        MAX_STEPS=6,
        EVAL_EVERY=2,
        PATIENCE=1,
        BATCH=16,
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", **{k: str(v) for k, v in settings.items()}}
    env["PATH"] = script_path()  # the test's python (served) first
    done = subprocess.run(
        ["bash", str(EXAMPLE / "run.sh")],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    record = json.loads((tmp_path / "work/runs/stock+unigram-ls/seed1/record.json").read_text())
    # Each setting reached translate.py (the stopping itself: test_hf_common.py).
    assert record["settings"]["patience"] == 1 and record["settings"]["max_steps"] == 6
    assert (
        record["settings"]["label_smoothing"] == "unigram" and record["settings"]["bias"] == "none"
    )
    assert (record["settings"]["dim"], record["settings"]["batch_size"]) == (16, 16)
    assert "| stock+unigram-ls |" in (tmp_path / "work/report.md").read_text()
