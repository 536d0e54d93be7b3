"""research/head_start_at_best.py: the default's lead over stock at update
1,000 and at stock's best, against records worked by hand."""

import json

import pytest
from research_scripts import benchmark_script

SETTING = "n3000_short-converge"
ARM = "gain-unigram"


@pytest.fixture(scope="module")
def lead():
    return benchmark_script("head_start_at_best")


def write_record(results, pair, arm, seed, updates, nll):
    folder = results / "runs" / f"{pair}_{SETTING}" / arm
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"seed{seed}.json").write_text(
        json.dumps(
            {"updates": updates, "nll": nll, "scores": {"bleu": 1.0, "chrf": 1.0}, "gain": None}
        )
    )


@pytest.fixture
def results(tmp_path):
    # Stock validates every 500; its best is 4.0 at 1,500.
    # Seed 1's default validates at 0, 1,000 and 2,000 only: interpolated onto
    # stock's grid it is 6.0, 5.25, 4.5, 4.25, 4.0 -> lead -2, -0.75, -0.5, +0.25, -0.2.
    write_record(
        tmp_path, "de-en", "stock", 1, [0, 500, 1000, 1500, 2000], [8.0, 6.0, 5.0, 4.0, 4.2]
    )
    write_record(tmp_path, "de-en", ARM, 1, [0, 1000, 2000], [6.0, 4.5, 4.0])
    # Seed 2: the same stock; the default 0.1 below it everywhere.
    write_record(
        tmp_path, "de-en", "stock", 2, [0, 500, 1000, 1500, 2000], [8.0, 6.0, 5.0, 4.0, 4.2]
    )
    write_record(tmp_path, "de-en", ARM, 2, [0, 500, 1000, 1500, 2000], [7.9, 5.9, 4.9, 3.9, 4.1])
    # Seed 3 has no default run: left out.
    write_record(tmp_path, "de-en", "stock", 3, [0, 1000], [8.0, 5.0])
    return tmp_path


def test_lead_is_the_default_on_stocks_grid_minus_stock(lead, results):
    found = lead.seed_pairs(results, "de-en", SETTING, ARM)
    assert sorted(found) == [1, 2]
    updates, difference = lead.lead_curve(*found[1])
    assert updates.tolist() == [0, 500, 1000, 1500, 2000]
    assert difference == pytest.approx([-2.0, -0.75, -0.5, 0.25, -0.2])


def test_seed_figures_worked_by_hand(lead, results):
    stock, default = lead.seed_pairs(results, "de-en", SETTING, ARM)[1]
    figures = lead.seed_figures(stock, default, lead.lead_curve(stock, default), margin=0.03)
    assert figures == pytest.approx(
        {
            "lead_early": -0.5,
            "stock_best_update": 1500.0,
            "lead_at_stock_best": 0.25,
            # the default's best 4.0 (at 2,000) against stock's 4.0
            "best_difference": 0.0,
            # ahead by >= 0.03 at 0, 500, 1,000 and 2,000 (not at 1,500)
            "last_ahead": 2000.0,
        }
    )


def test_table_is_the_mean_over_seeds_with_both_arms_written_with_its_plot(
    lead, results, tmp_path, capsys
):
    out = tmp_path / "lead.md"
    setting = f"3,000 short={SETTING}:{ARM}"
    argv = ["--results", str(results), "--pairs", "de-en", "fr-en", "--setting", setting]
    lead.main([*argv, "--out", str(out)])
    printed = capsys.readouterr().out
    # lead at 1,000: -0.5 and -0.1; at stock's best (1,500): +0.25 and -0.1;
    # bests: 0.0 and -0.1; fr-en has no records and no row.
    row = (
        "| 3,000 short | de-en | 1, 2 | -0.300 ± 0.200 | 1500 ± 0 | +0.075 ± 0.175 | "
        "-0.050 ± 0.050 | 2000 ± 0 |"
    )
    assert row in printed and "| fr-en |" not in printed
    text = out.read_text()
    assert text.endswith(printed.rstrip("\n") + "\n")
    assert "regenerate with `.venv/bin/python research/head_start_at_best.py --results" in text
    assert "--out" in text and "[lead.png](lead.png)" in text
    assert (tmp_path / "lead.png").stat().st_size > 0


def test_bad_input_names_the_problem(lead, results):
    with pytest.raises(SystemExit, match="is not LABEL=SETTING:ARM"):
        lead.main(["--results", str(results), "--setting", "n3000_short-converge"])
    with pytest.raises(SystemExit, match="no seed has both stock and the arm"):
        lead.main(["--results", str(results), "--setting", f"x={SETTING}:absent-arm"])
