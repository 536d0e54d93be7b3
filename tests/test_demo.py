"""make demo (examples/paper/demo.py) end to end on a small slice of real text."""

import json
import math
import os
import subprocess

import numpy as np
import pytest
from fairseq.data import Dictionary
from natbias_testing import REPO, sacrebleu_scores, script_python, write_multi30k_slice
from test_counts import hand_counts

SLICE = {"train": 3000, "val": 100, "test_2016_flickr": 50}
# A few updates are enough for every step to run and write what is checked
# (the update-0 figures below come from natbias-step0, before any update).
MAX_UPDATE = 5
# Two of the three arms: the default and stock. The zero arm runs the same
# steps with --natbias-init zero (trained and scored end to end by the
# translation example, tests/test_examples.py); leaving it out here saves its
# three fairseq processes (natbias-step0, fairseq-train, fairseq-generate).
ARMS = ("unigram", "stock")


@pytest.fixture(scope="module")
def multi30k_slice(tmp_path_factory):
    return write_multi30k_slice(tmp_path_factory.mktemp("multi30k_slice"), SLICE)


def natbias_demo(data, output, **env):
    # One thread for the demo's fairseq processes, as for the tests' own
    # (tests/conftest.py): the pytest workers already use every core. Its
    # fairseq tools are the fork server's (tests/fork_server.py).
    return subprocess.run(
        [
            script_python(),
            str(REPO / "examples/paper/demo.py"),
            "--data",
            str(data),
            "--output",
            str(output),
            "--max-update",
            str(MAX_UPDATE),
            "--vocab-size",
            "1000",
            "--arms",
            *ARMS,
        ],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, OMP_NUM_THREADS="1", **env),
    )


@pytest.mark.training
def test_demo_runs_end_to_end_and_skips_finished_steps(multi30k_slice, tmp_path):
    first = natbias_demo(multi30k_slice, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "| unigram |" in report and "| stock |" in report and "| zero |" not in report
    assert "| update | unigram | stock |" in report
    assert not (tmp_path / "zero").exists()
    assert "nrefs:1|case:mixed|eff:no|tok:13a" in report  # sacreBLEU signature
    assert (tmp_path / "valid_nll.png").stat().st_size > 5000
    references = (multi30k_slice / "test_2016_flickr.en").read_text().splitlines()
    references = [line.strip() for line in references]
    for init in ARMS:
        # The scores are the hypotheses written, against the slice's English
        # in order, as sacreBLEU scores them (rounded to 2 digits).
        scores = json.loads((tmp_path / init / "test_scores.json").read_text())
        hypotheses = (tmp_path / init / "test.hyp").read_text().splitlines()
        assert len(hypotheses) == SLICE["test_2016_flickr"] == len(references)
        bleu, chrf = sacrebleu_scores(hypotheses, references)
        assert (scores["bleu"], scores["chrf"]) == (round(bleu, 2), round(chrf, 2))
    step0 = {i: json.loads((tmp_path / i / "step0.json").read_text()) for i in ARMS}
    # Fig. 1 at update 0 with the default settings: the fresh unigram model is
    # at the unigram's cross-entropy (on this slice's SentencePiece model), the
    # stock model far above it. That cross-entropy counted here, in float64,
    # from the English pieces the demo wrote (each line's pieces and EOS, as
    # fairseq binarises them), add-one smoothing (the default) written out.
    dictionary = Dictionary.load(str(tmp_path / "data-bin" / "dict.en.txt"))
    train = hand_counts(tmp_path / "text" / "train.en", dictionary).astype(np.float64)
    valid = hand_counts(tmp_path / "text" / "valid.en", dictionary).astype(np.float64)
    log_unigram = np.log((train + 1.0) / (train.sum() + len(train)))
    unigram_ce_bits = -(valid * log_unigram).sum() / valid.sum() / math.log(2)
    assert step0["unigram"]["unigram_ce"] == pytest.approx(unigram_ce_bits, abs=5e-5)  # 4 decimals
    assert abs(step0["unigram"]["nll"] - unigram_ce_bits) < 0.3
    assert step0["stock"]["nll"] > step0["unigram"]["nll"] + 2.0
    assert f"train [unigram]: update {MAX_UPDATE}/{MAX_UPDATE}" in first.stdout

    # Run again: every step finished before is skipped, no fairseq process started.
    again = natbias_demo(multi30k_slice, tmp_path)
    assert "preprocess" in again.stdout and "skipped" in again.stdout
    assert "train [stock]: finished before, skipped" in again.stdout
    assert "generate [unigram]: scored before, skipped" in again.stdout


def test_an_unknown_arm_is_refused_in_one_line(capsys):
    import demo

    with pytest.raises(SystemExit) as stop:
        demo.main(["--arms", "unigram", "uniform"])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--arms: invalid choice: 'uniform'" in error and "'zero'" in error
