"""research/study_learning_efficiency.py's arithmetic on runs written here:
the options of a --converge run, and the table of a converged study (stock's
best validation NLL as the target, the update of each run's best, the ratio to
stock's best update, both test sets), checked against values worked by hand.
The script holds the command line; its parts live in research/study/ (arms,
runs, summary) and are read here through the script."""

import json

import numpy as np
import pytest
from research_scripts import benchmark_script

SIGNATURES = {"bleu_signature": "nrefs:1|tok:13a", "chrf_signature": "nrefs:1|nc:6"}


@pytest.fixture(scope="module")
def study():
    return benchmark_script("study_learning_efficiency")


def _write_run(run_dir, curve, bleu_2016, bleu_2017, step0=8.0):
    """A finished --converge run: fairseq's json valid lines, update 0 and scores."""
    run_dir.mkdir(parents=True)
    (run_dir / "train.log").write_text(
        "".join(
            f'2026-11-23 16:34:33 | INFO | valid | {{"epoch": 1, "valid_loss": "{nll + 1}", '
            f'"valid_nll_loss": "{nll}", "valid_num_updates": "{update}"}}\n'
            for update, nll in curve
        )
    )
    (run_dir / "step0.json").write_text(json.dumps({"nll": step0, "unigram_ce": 8.1}))
    (run_dir / "test_scores.json").write_text(
        json.dumps({"bleu": bleu_2016, "chrf": 50.0, **SIGNATURES})
    )
    (run_dir / "test_2017_flickr_scores.json").write_text(
        json.dumps({"bleu": bleu_2017, "chrf": 45.0, **SIGNATURES})
    )
    (run_dir / "done").touch()


def test_converge_options_drop_bleu_and_pick_the_best_by_nll(study):
    options = study.converge_options(study.Translation.options, "nll_loss")
    assert not any(
        option.startswith("--eval-bleu") or option == "--maximize-best-checkpoint-metric"
        for option in options
    )
    assert "{" not in " ".join(options)  # --eval-bleu-args' value went with it
    assert options[-2:] == ["--best-checkpoint-metric", "nll_loss"]
    assert "--share-all-embeddings" in options  # the model's options stay


def test_converged_table_aims_at_stocks_best(study, tmp_path):
    # stock's seeds are best (4.0, 3.8) at updates 1000 and 1500, then worse:
    # the target is their mean, 3.9, and stock's mean best update 1250.
    stock = {
        1: [(500, 5.0), (1000, 4.0), (1500, 4.2)],
        2: [(500, 5.0), (1000, 4.2), (1500, 3.8), (2000, 3.9)],
    }
    # The natbias arm falls through 3.9 between 500 (4.3) and 750 (3.5): at
    # 500 + 250 * (4.3 - 3.9) / (4.3 - 3.5) = 625, in both seeds.
    natbias = {
        1: [(500, 4.3), (750, 3.5), (1000, 3.6)],
        2: [(500, 4.3), (750, 3.5), (1000, 3.4), (1250, 3.45)],
    }
    root = tmp_path / "short-converge"
    for seed in (1, 2):
        _write_run(root / "stock" / f"seed{seed}", stock[seed], 20.0 + seed, 18.0 + seed, 13.7)
        _write_run(root / "gain-unigram" / f"seed{seed}", natbias[seed], 23.0 + seed, 20.0 + seed)
    task = study.Translation("de-en", ("test_2017_flickr",))
    arms = [study.Arm.parse("stock"), study.Arm.parse("gain/unigram")]
    runs = study.collect_runs(task, root, arms, [1, 2])
    rows, target, _, _ = study.summarise(task, runs, converge=True)
    assert target == pytest.approx(3.9)
    by_arm = {row["arm"]: row for row in rows}
    assert by_arm["gain/unigram"]["reach"] == [pytest.approx(625.0)] * 2
    assert by_arm["stock"]["best_update"] == [1000, 1500]
    assert by_arm["stock"]["last_update"] == [1500, 2000]
    assert by_arm["gain/unigram"]["best_update"] == [750, 1000]
    assert by_arm["gain/unigram"]["best_nll"].mean == pytest.approx((3.5 + 3.4) / 2)
    assert by_arm["gain/unigram"]["bleu_test_2017_flickr"].mean == pytest.approx(21.5)
    table = study.markdown_converged(rows, target, "t", study.CONVERGE_TEST_SETS)
    assert "updates to reach stock's best valid NLL (3.900)" in table
    assert "is scored, beam 5." in table
    # the same rows as a language model's: scored by fairseq-eval-lm, no beam
    lm_rows = [
        {
            **{k: v for k, v in row.items() if not k.startswith(("bleu", "chrf"))},
            "test_nll": row["best_nll"],
            "test_ppl": row["best_nll"],
        }
        for row in rows
    ]
    lm_table = study.markdown_converged(lm_rows, target, "t", study.CONVERGE_TEST_SETS)
    assert "is scored, by fairseq-eval-lm on the test set." in lm_table
    assert "beam" not in lm_table
    assert (
        "| gain/unigram | 2 | 8.000 ± 0.000 (n=2) | 625, 625 | 3.450 ± 0.050 (n=2) | 750, 1000 | 1000, 1250 |"
        in table
    )
    # 625 of stock's 1250: 0.50x; BLEU 24.5 against 21.5 (2016), 21.5 against 19.5 (2017).
    assert "updates to reach stock: 0.50x of stock's 1250 to its best" in table
    assert "test BLEU +3.000" in table and "test_2017_flickr BLEU +2.000" in table
    # Differences are paired by seed: best NLL 3.5 - 4.0 and 3.4 - 3.8, so
    # -0.45 with s.e. |(-0.5) - (-0.4)| / 2 = 0.05 (unpaired it would be
    # sqrt(0.05^2 + 0.1^2) = 0.112); BLEU +3 on both seeds, s.e. 0.
    assert "best valid NLL -0.450 (paired over 2 seeds, s.e. 0.050, -9.0 s.e.)" in table
    assert "test BLEU +3.000 (paired over 2 seeds, s.e. 0.000)" in table
    # Reach by horizon, h = 1000 only (stock's shortest run ends at 1500):
    # stock's mean NLL there is (4.0 + 4.2) / 2 = 4.1, which the natbias arm
    # crosses at 500 + 250 * (4.3 - 4.1) / (4.3 - 3.5) = 562.5 in both seeds.
    horizons, ratios = study.reach_by_horizon(runs)["gain/unigram"]
    assert horizons == [1000] and ratios.tolist() == [[pytest.approx(0.5625)]] * 2
    assert "| gain/unigram | 0.56 ± 0.00 |" in study.markdown_reach_by_horizon(
        {"gain/unigram": (horizons, ratios)}
    )
    # A seed that never reaches stock at some h is shown seed by seed there.
    partly = np.array([[0.5625, 0.9], [0.5, np.inf]])
    assert "| gain/unigram | 0.53 ± 0.03 | 0.90, never |" in study.markdown_reach_by_horizon(
        {"gain/unigram": ([1000, 2000], partly)}
    )


def test_differences_pair_only_the_seeds_both_arms_have(study, tmp_path):
    """Seeds 1-3 against 1-2 pair seeds 1 and 2 alone; against seed 1 alone,
    that seed's difference, without a standard error; with no seed in
    common, the difference of the means."""
    root = tmp_path / "short-converge"
    curves = {"stock": {1: 4.0, 2: 3.8, 3: 3.0}, "gain-unigram": {1: 3.5, 2: 3.4}}
    for folder, bests in curves.items():
        for seed, best in bests.items():
            _write_run(root / folder / f"seed{seed}", [(500, 5.0), (1000, best)], 20.0, 18.0)
    task = study.Translation("de-en", ("test_2017_flickr",))
    arms = [study.Arm.parse("stock"), study.Arm.parse("gain/unigram")]

    def best_nll_line(stock_seeds, natbias_seeds):
        runs = study.collect_runs(task, root, arms, [1, 2, 3])
        runs = {
            arm: [
                r
                for r in records
                if r["seed"] in (stock_seeds if arm.name == "stock" else natbias_seeds)
            ]
            for arm, records in runs.items()
        }
        rows, target, _, _ = study.summarise(task, runs, converge=True)
        table = study.markdown_converged(rows, target, "t", study.CONVERGE_TEST_SETS)
        return table.split("best valid NLL ")[-1]

    # (3.5 + 3.4) / 2 - (4.0 + 3.8 + 3.0) / 3 = 3.45 - 3.6 = -0.15, but paired
    # over seeds 1-2: -0.45, s.e. 0.05.
    assert best_nll_line({1, 2, 3}, {1, 2}).startswith("-0.450 (paired over 2 seeds, s.e. 0.050")
    # seed 1 alone for the natbias arm: that seed's 3.5 - 4.0, not 3.5 - 3.6.
    assert best_nll_line({1, 2, 3}, {1}).startswith("-0.500 (seed 1 only: no s.e.)")
    # no seed in common: the difference of the means, 3.4 - 4.0, one seed each.
    assert best_nll_line({1}, {2}).startswith("-0.600 (one seed: no s.e.)")


def test_archived_records_stand_in_for_runs_whose_logs_are_gone(study, tmp_path):
    """Seeds 1 and 2 summarised with an archive, then their run folders
    deleted (a machine lost), seed 3 trained later: the summary over seeds
    1-3 reads 1 and 2 from the archive and equals one over all three logs."""
    stock = {
        1: [(500, 5.0), (1000, 4.0)],
        2: [(500, 5.2), (1000, 3.8)],
        3: [(500, 4.9), (1000, 3.9)],
    }
    natbias = {
        1: [(500, 4.3), (1000, 3.7)],
        2: [(500, 4.1), (1000, 3.9)],
        3: [(500, 4.2), (1000, 3.6)],
    }

    def write(root, seeds):
        for seed in seeds:
            _write_run(root / "stock" / f"seed{seed}", stock[seed], 20.0 + seed, 18.0, 13.7)
            _write_run(root / "gain-unigram" / f"seed{seed}", natbias[seed], 23.0 + seed, 20.0)

    task = study.Translation("de-en", ("test_2017_flickr",))
    arms = [study.Arm.parse("stock"), study.Arm.parse("gain/unigram")]
    lost, archive = tmp_path / "lost" / "short-converge", tmp_path / "results" / "runs"
    write(lost, [1, 2])
    assert [len(r) for r in study.collect_runs(task, lost, arms, [1, 2], archive).values()] == [
        2,
        2,
    ]
    kept = json.loads((archive / "gain-unigram" / "seed2.json").read_text())
    assert kept["nll"] == [8.0, 4.1, 3.9] and kept["scores"]["bleu"] == 25.0
    for arm in arms:
        for seed in (1, 2):
            for path in (lost / arm.folder / f"seed{seed}").iterdir():
                path.unlink()
    write(lost, [3])
    both = tmp_path / "whole" / "short-converge"
    write(both, [1, 2, 3])
    tables = []
    for root, archived in ((lost, archive), (both, None)):
        runs = study.collect_runs(task, root, arms, [1, 2, 3], archived)
        rows, target, _, _ = study.summarise(task, runs, converge=True)
        tables.append(
            study.markdown_converged(rows, target, "t", study.CONVERGE_TEST_SETS, 0)
            + study.markdown_reach_by_horizon(study.reach_by_horizon(runs))
        )
    assert tables[0] == tables[1]
    # stock's best, (4.0 + 3.8 + 3.9) / 3 = 3.9, crossed by the natbias arm
    # between 500 and 1000 at 500 + 500 * (v500 - 3.9) / (v500 - v1000):
    # seed 1 (4.3, 3.7) 833, seed 2 (4.1, 3.9) 1000, seed 3 (4.2, 3.6) 750.
    assert "updates to reach stock's best valid NLL (3.900)" in tables[0]
    assert "| gain/unigram | 3 | 8.000 ± 0.000 (n=3) | 833, 1000, 750 |" in tables[0]


def test_zoomed_panel_keeps_the_line_from_its_first_update(study):
    line = {
        "label": "stock",
        "x": np.array([0, 1000, 2000, 3000]),
        "mean": np.array([13.0, 4.0, 3.0, 2.5]),
        "low": np.array([12.0, 3.9, 2.9, 2.4]),
        "high": np.array([14.0, 4.1, 3.1, 2.6]),
    }
    zoomed = study.from_update(line, 2000)
    assert zoomed["label"] == "stock"
    assert zoomed["x"].tolist() == [2000, 3000] and zoomed["mean"].tolist() == [3.0, 2.5]
    assert zoomed["low"].tolist() == [2.9, 2.4] and zoomed["high"].tolist() == [3.1, 2.6]


def test_the_command_line_runs_as_users_run_it():
    """``python research/study_learning_efficiency.py`` from the repository
    root finds its parts (research/study/) and says its docstring as --help."""
    import subprocess

    from natbias_testing import REPO, script_python

    script = REPO / "research" / "study_learning_efficiency.py"
    shown = subprocess.run(
        [script_python(), str(script.relative_to(REPO)), "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert shown.startswith("usage: study_learning_efficiency.py")
    assert "The paper's learning-efficiency claim, measured on real data" in shown
    assert "--summarise-only" in shown and "--train-pairs N" in shown


def test_the_zoomed_panel_starts_at_a_quarter_of_a_short_budget(study):
    """2,000 for the 20,000-update runs (as before), 500 for 2,000-update ones."""
    from study import summary

    def line(last):
        return {"label": "stock", "x": [0, last // 2, last], "mean": [1, 2, 3]}

    assert summary.zoom_start([line(20000), line(19000)]) == 2000
    assert summary.zoom_start([line(2000), line(1800)]) == 500
