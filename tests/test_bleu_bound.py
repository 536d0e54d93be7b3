"""benchmarks/bleu_bound.py: the pooled noise, the per-cell p-values, Holm's
adjustment and the chance of meeting the target, each checked against a
value worked by hand; then the whole script on records written here."""

import json
import math

import pytest

from natbias_testing import benchmark_script


@pytest.fixture(scope="module")
def bound():
    return benchmark_script("bleu_bound")


def test_the_pooled_sd_weights_each_sample_by_its_degrees_of_freedom(bound):
    # [1, 3]: squares about the mean 2 sum to 2 (1 dof); [0, 0, 3]: about 1,
    # 1 + 1 + 4 = 6 (2 dof); a single value adds nothing. sqrt(8 / 3).
    sd, dof = bound.pooled_sd([[1, 3], [0, 0, 3], [7]])
    assert dof == 3
    assert sd == pytest.approx(math.sqrt(8 / 3))


def test_no_sample_with_two_seeds_is_refused(bound):
    with pytest.raises(SystemExit, match="no cell has two seeds"):
        bound.pooled_sd([[1.0], [2.0]])


def test_the_deficit_p_is_students_t_against_minus_the_bound(bound):
    # t = (-1.3 + 0.3) / (2 / sqrt(4)) = -1; with 1 dof Student's t is the
    # Cauchy distribution: P(T <= -1) = 1/2 + atan(-1) / pi = 1/4.
    assert bound.deficit_p(-1.3, 4, 2.0, 1, 0.3) == pytest.approx(0.25)
    # A mean exactly at the bound: t = 0, p = 1/2 whatever the dof.
    assert bound.deficit_p(-0.3, 3, 0.5, 7, 0.3) == pytest.approx(0.5)


def test_holm_steps_down_and_keeps_the_order(bound):
    # Sorted 0.01, 0.03, 0.04: 3 x 0.01 = 0.03; 2 x 0.03 = 0.06;
    # 1 x 0.04 = 0.04, raised to the running 0.06.
    assert bound.holm([0.04, 0.01, 0.03]) == pytest.approx([0.06, 0.03, 0.06])
    assert bound.holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])


def normal_cdf(z):
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def test_the_chance_to_pass_every_cell_and_the_seeds_it_needs(bound):
    # bound sqrt(n) / sd = 0.82245 x 2 / 1 = 1.6449, Phi = 0.95; two cells 0.95^2.
    assert bound.pass_chance(4, 1.0, 0.82245, 2) == pytest.approx(normal_cdf(1.6449) ** 2)
    assert bound.pass_chance(4, 1.0, 0.82245, 2) == pytest.approx(0.9025, abs=1e-4)
    # One cell, sd 1, bound 0.5: 0.5 sqrt(10) = 1.581 (Phi 0.943) falls short,
    # 0.5 sqrt(11) = 1.658 (Phi 0.951) does not.
    assert normal_cdf(0.5 * math.sqrt(10)) < 0.95 <= normal_cdf(0.5 * math.sqrt(11))
    assert bound.seeds_needed(1.0, 0.5, 1) == 11


def write_record(results, folder, arm_folder, seed, test_2016, test_2017):
    path = results / "runs" / folder / arm_folder / f"seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "updates": [0, 100], "nll": [5.0, 3.0], "step0": {"nll": 5.0}, "gain": None,
        "scores": {"bleu": test_2016, "chrf": 50.0, "bleu_test_2017_flickr": test_2017,
                   "chrf_test_2017_flickr": 45.0}}))


def test_the_script_reads_records_and_names_each_cells_verdict(bound, tmp_path, monkeypatch, capsys):
    # One setting, one pair, three seeds. Differences (arm - stock):
    # test_2016 -2, -2.2, -1.8 (mean -2.0, far below); test_2017 +1, 0, -1 (mean 0, met).
    stock = {1: (30.0, 20.0), 2: (31.0, 21.0), 3: (32.0, 22.0)}
    arm = {1: (28.0, 21.0), 2: (28.8, 21.0), 3: (30.2, 21.0)}
    for seed in stock:
        write_record(tmp_path, "x-y_n10_short-converge", "stock", seed, *stock[seed])
        write_record(tmp_path, "x-y_n10_short-converge", "gain-unigram", seed, *arm[seed])
    monkeypatch.setattr(bound, "SELECTIONS",
                        {"default": [("_n10", "short-converge", "gain/unigram", "10 pairs")]})
    out = tmp_path / "bound.md"
    bound.main(["--results", str(tmp_path), "--pairs", "x-y", "--out", str(out)])
    text = capsys.readouterr().out
    # Pooled: squares 0.04 + 0 + 0.04 = 0.08 and 1 + 0 + 1 = 2 over 2 + 2 dof.
    assert f"**{math.sqrt(2.08 / 4):.2f} BLEU** (4 degrees of freedom, 2 cells)" in text
    rows = [line for line in text.splitlines() if line.startswith("| 10 pairs")]
    assert "-2.00 ± 0.12" in rows[0] and rows[0].endswith("**below, significant** |")
    assert "+0.00 ± 0.58" in rows[1] and rows[1].endswith("| met |")
    # The first cell's p: t = (-2.0 + 0.3) / (sqrt(0.52) / sqrt(3)) on 4 dof.
    t = (-2.0 + 0.3) / (math.sqrt(0.52) / math.sqrt(3))
    p = bound.stats.t.cdf(t, 4)
    assert f"| {p:.3f} |" in rows[0]
    # Holm over two cells: the smaller p doubled (the other cell's p is near 1).
    assert f"| {p:.3f} | {2 * p:.3f} |" in rows[0]
    assert "Cells meeting the target as written: 1 of 2." in text
    assert out.read_text().startswith("# Issue 36's BLEU bound")
    assert (tmp_path / "bound.png").stat().st_size > 0


def test_a_selection_without_records_is_refused(bound, tmp_path):
    (tmp_path / "runs").mkdir()
    with pytest.raises(SystemExit, match="no records for the selection"):
        bound.main(["--results", str(tmp_path)])


def test_a_bound_of_zero_or_less_is_refused_not_looped_on(bound, tmp_path, capsys):
    with pytest.raises(ValueError, match="above 0"):
        bound.seeds_needed(0.5, 0.0, 3)
    with pytest.raises(SystemExit):
        bound.main(["--results", str(tmp_path), "--bound", "-0.3"])
    assert "--bound -0.3: give the BLEU below stock allowed, above 0" in capsys.readouterr().err
