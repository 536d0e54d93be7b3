"""examples/huggingface/report.py on hand-made run records (no training):
the pairing by seed and the reach of stock's best."""

import json
import math
import sys

import pytest
from natbias_testing import REPO

sys.path.insert(0, str(REPO / "examples" / "huggingface"))
import report  # noqa: E402


def record(best, best_update, bleu, updates=(0, 100, 200), nll=None):
    return {
        "updates": list(updates),
        "nll": list(nll or (12.0, best + 1.0, best)),
        "best_nll": best,
        "best_update": best_update,
        "unigram_nll": 8.0,
        "scores": {"test": {"BLEU": bleu, "chrF": 40.0, "bleu_signature": "nrefs:1"}},
    }


def write(work, arm, seed, data):
    folder = work / "runs" / arm / f"seed{seed}"
    folder.mkdir(parents=True)
    (folder / "record.json").write_text(json.dumps(data))
    (folder / "done").write_text("{}\n")


@pytest.fixture
def runs(tmp_path):
    write(tmp_path, "stock", 1, record(4.4, 200, 20.0))
    write(tmp_path, "stock", 2, record(4.2, 200, 22.0))
    write(tmp_path, "stock+unigram-ls", 1, record(4.2, 200, 21.0))
    write(tmp_path, "stock+unigram-ls", 2, record(4.1, 200, 23.0))
    write(tmp_path, "natbias+unigram-ls", 1, record(4.1, 200, 21.5))
    write(tmp_path, "natbias+unigram-ls", 2, record(4.0, 200, 22.0))
    write(tmp_path, "natbias+unigram-ls", 3, record(3.0, 200, 99.0))  # no stock seed 3
    (tmp_path / "runs/stock/seed3").mkdir()  # unfinished: no record, no done
    return report.load_runs(tmp_path)


def test_each_arm_is_paired_by_seed_with_stock_and_stock_with_the_criterion(runs):
    rows = {(r["arm"], r["reference"]): r for r in report.paired_differences(runs)}
    # stock+unigram-ls against stock is listed once, stock against it not again.
    assert set(rows) == {
        ("natbias+unigram-ls", "stock"),
        ("stock+unigram-ls", "stock"),
        ("natbias+unigram-ls", "stock+unigram-ls"),
    }
    row = rows[("natbias+unigram-ls", "stock")]
    assert row["seeds"] == [1, 2]  # seed 3 has no stock run to pair with
    # Differences by hand: best (4.1 - 4.4, 4.0 - 4.2) = (-0.3, -0.2); BLEU (+1.5, 0.0).
    assert row["best"].mean == pytest.approx(-0.25)
    assert row["best"].stderr == pytest.approx(0.05)  # s = 0.0707, / sqrt 2
    assert row["test BLEU"].mean == pytest.approx(0.75)
    against_criterion = rows[("natbias+unigram-ls", "stock+unigram-ls")]
    assert against_criterion["best"].mean == pytest.approx(-0.1)
    assert against_criterion["test BLEU"].mean == pytest.approx(-0.25)


def test_reach_is_measured_against_stocks_best():
    # Stock's best 4.4 at update 200; this run passes 4.4 halfway from 100 to 200
    # (5.0 at 100, 3.8 at 200): 150 updates, 0.75 of stock's 200.
    run = record(3.8, 200, 20.0, nll=(12.0, 5.0, 3.8))
    assert report.reach(run, 4.4) == pytest.approx(150.0)
    assert report.reach(record(4.5, 200, 20.0), 4.4) == math.inf
    rows, target = report.summary({"stock": {1: record(4.4, 200, 20.0)}, "natbias": {1: run}})
    assert target == pytest.approx(4.4)
    assert rows[1]["reach"].mean == pytest.approx(0.75)
