"""research/combine_seeds.py: seeds from typed-in rows, run records and
two-seed chrF summaries, combined into means and paired differences, checked
against values worked by hand."""

import json

import pytest
from research_scripts import benchmark_script

ROWS = """# a comment line, as in the committed file
pair,arm,seed,best_valid_nll,bleu_test_2016,chrf_test_2016,bleu_test_2017,chrf_test_2017
x-y,stock,1,2.0,30,,20,
x-y,stock,2,2.2,32,,22,
x-y,stock,3,9.9,99,99,99,99
x-y,gain/unigram,1,2.1,31,,21,
x-y,gain/unigram,2,2.1,35,,21,
"""
TWO_SEED_CHRF = """# mean +- s.e. of two seeds
pair,arm,test_set,mean,stderr
x-y,stock,test_2016,50,1
"""
ARMS = ("stock", "gain/unigram", "gain/zero")
# Seed 3 of stock, as the study writes its record: it overrides the row above.
RECORD = {
    "updates": [0, 250, 500],
    "nll": [5.0, 2.3, 2.4],
    "scores": {
        "bleu": 34.0,
        "chrf": 52.0,
        "bleu_test_2017_flickr": 24.0,
        "chrf_test_2017_flickr": 40.0,
    },
    "step0": {"nll": 5.0},
    "gain": None,
}


@pytest.fixture(scope="module")
def combine():
    return benchmark_script("combine_seeds")


@pytest.fixture
def results(tmp_path):
    (tmp_path / "seeds").mkdir()
    (tmp_path / "seeds" / "short-converge_before_records.csv").write_text(ROWS)
    (tmp_path / "seeds" / "short-converge_two_seed_chrf.csv").write_text(TWO_SEED_CHRF)
    record = tmp_path / "runs" / "x-y_short-converge" / "stock" / "seed3.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps(RECORD))
    return tmp_path


def test_a_language_models_record_is_refused_with_where_to_go(combine, results):
    record = results / "runs" / "lm-en_n3000_short-converge" / "stock" / "seed1.json"
    record.parent.mkdir(parents=True)
    record.write_text(
        json.dumps({"nll": [6.0, 5.7], "updates": [0, 100], "scores": {"nll": 5.7, "ppl": 52.0}})
    )
    with pytest.raises(SystemExit, match="holds no BLEU .*--summarise-only"):
        combine.collect_seeds(["lm-en_n3000"], ["stock"], results)


def test_table_means_by_hand(combine, results):
    seeds, two_seed = (
        combine.collect_seeds(["x-y"], ARMS, results),
        combine.two_seed_values(results),
    )
    text = combine.table(seeds, two_seed, ["x-y"], ["stock", "gain/unigram"])
    # stock NLL 2.0, 2.2, 2.3: mean 2.1667; squared deviations 0.02778 + 0.00111
    # + 0.01778 = 0.04667, / 2 = 0.02333, s = 0.15275, s.e. = s / sqrt 3 = 0.0882.
    # BLEU 30, 32, 34: mean 32, s = 2, s.e. 1.1547. chrF: seed 3's record 52, and
    # seeds 1-2's two-seed mean 50 ± 1 read back as (a + b)/2 = 50, |a - b|/2 = 1,
    # so 49 and 51: 50.67, s.e. 0.88. test_2017's chrF: two seeds lack it and no
    # two-seed summary fills them, so n/a.
    assert (
        "| x-y stock | 1, 2, 3 | 2.167 ± 0.088 | 32.00 ± 1.15 | 50.67 ± 0.88 | 22.00 ± 1.15 | n/a |"
        in text
    )
    assert (
        "| x-y gain/unigram | 1, 2 | 2.100 ± 0.000 | 33.00 ± 2.00 | n/a | 21.00 ± 0.00 | n/a |"
        in text
    )


def test_differences_pair_by_seed(combine, results):
    seeds, two_seed = (
        combine.collect_seeds(["x-y"], ARMS, results),
        combine.two_seed_values(results),
    )
    # Seeds 1 and 2 only (the default has no seed 3): NLL +0.1 and -0.1, mean 0,
    # s = 0.1414, s.e. 0.1; BLEU test_2016 +1 and +3: mean +2, s.e. 1.
    common, diffs = combine.paired_difference(
        seeds, "x-y", "gain/unigram", "stock", "bleu_test_2016"
    )
    assert (common, diffs) == ([1, 2], [1.0, 3.0])
    line = combine.differences(seeds, two_seed, ["x-y"], [("gain/unigram", "stock")])
    assert "best_valid_nll +0.000 ± 0.100 (seeds 1, 2)" in line
    assert "bleu_test_2016 +2.00 ± 1.00 (seeds 1, 2)" in line
    assert "chrf" not in line  # the default has no chrF at all
    assert combine.differences(seeds, two_seed, ["x-y"], [("gain/zero", "stock")]) == ""


def test_per_seed_table_sets_the_arms_side_by_side_a_record_over_a_typed_in_row(combine, results):
    seeds = combine.collect_seeds(["x-y"], ARMS, results)
    text = combine.per_seed_table(seeds, ["x-y"], ["stock", "gain/unigram"])
    assert "| x-y 1 | 2.000 / 2.100 | 30.00 / 31.00 | 20.00 / 21.00 |" in text
    # Seed 3: stock's run record (NLL min 2.3), not its typed-in row (9.9, 99),
    # and no row of the default: a dash.
    assert "| x-y 3 | 2.300 / – | 34.00 / – | 24.00 / – |" in text
    assert text.count("| x-y ") == 3


def test_the_committed_table_is_what_the_committed_sources_give(
    combine, tmp_path, monkeypatch, capsys
):
    """The default command, on a results folder holding the committed run
    records and CSVs, writes research/results/converge_3seeds.md byte for
    byte: what it prints, under the header."""
    for sources in ("runs", "seeds"):
        (tmp_path / sources).symlink_to(combine.RESULTS / sources)
    committed = combine.RESULTS / "converge_3seeds.md"
    monkeypatch.setattr(combine, "RESULTS", tmp_path)
    combine.main([])
    printed = capsys.readouterr()
    assert (tmp_path / "converge_3seeds.md").read_bytes() == committed.read_bytes()
    assert committed.read_text().endswith(printed.out)
    assert printed.err == f"wrote {tmp_path / 'converge_3seeds.md'}\n"


def test_another_selection_writes_only_with_out_and_names_its_command(combine, results, capsys):
    combine.main(["--results", str(results), "--pairs", "x-y"])
    assert not (results / "converge_3seeds.md").exists() and capsys.readouterr().err == ""
    out = results / "o.md"
    argv = ["--results", str(results), "--pairs", "x-y", "--budget", "2,000 updates"]
    combine.main([*argv, "--out", str(out)])
    text = out.read_text()
    assert text.endswith(capsys.readouterr().out)
    assert (
        f"regenerate with `.venv/bin/python research/combine_seeds.py --results {results} "
        f"--pairs x-y --budget '2,000 updates' --out {out}`"
    ) in text
    assert "Multi30k, short-converge, 2,000 updates: mean ± standard error" in text


def test_another_setting_reads_its_own_records_and_leaves_unscored_sets_blank(
    combine, results, capsys
):
    """--setting paper-converge-cuda combines runs/<pair>_paper-converge-cuda
    alone (no typed-in rows exist for it); a record without test_2017 scores
    (decoding cut off) gives its figures for the rest and dashes there."""
    folder = results / "runs" / "x-y_paper-converge-cuda"
    for arm, nll, bleu in (("stock", [9.0, 4.5, 4.6], 20.0), ("gain-unigram", [8.0, 4.4], 20.5)):
        (folder / arm).mkdir(parents=True)
        (folder / arm / "seed1.json").write_text(
            json.dumps(
                {
                    "updates": [0, 100, 200][: len(nll)],
                    "nll": nll,
                    "scores": {"bleu": bleu, "chrf": 40.0},
                    "step0": {"nll": nll[0]},
                    "gain": None,
                }
            )
        )
    out = results / "paper.md"
    combine.main(
        [
            "--results",
            str(results),
            "--setting",
            "paper-converge-cuda",
            "--pairs",
            "x-y",
            "--arms",
            "stock",
            "gain/unigram",
            "--compare",
            "gain/unigram:stock",
            "--out",
            str(out),
        ]
    )
    capsys.readouterr()
    text = out.read_text()
    assert "| x-y 1 | 4.500 / 4.400 | 20.00 / 20.50 | – / – |" in text
    assert "best_valid_nll -0.100 (seeds 1)" in text and "bleu_test_2016 +0.50" in text
    assert "--setting paper-converge-cuda" in text and "before_records" not in text
    assert "x-y stock | 1 | 4.500" in text  # seeds 1-3 of the typed-in rows are not read
