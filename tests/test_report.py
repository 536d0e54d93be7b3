"""natbias-report over a run grid: test BLEU/chrF and ALC, mean ± standard error."""

import json
import math
import statistics
import subprocess

import pytest
from natbias_testing import BIN, console_script_help

from natbias.errors import NaturalBiasError
from natbias.tools import cli as report_cli
from natbias.tools import report, runs

# dataset -> init -> per-seed (test BLEU, test chrF, constant validation BLEU)
GRID = {
    "iwslt": {
        "unigram": [(30.0, 50.0, 10.0), (31.0, 52.0, 12.0), (33.0, 51.0, 14.0)],
        "zero": [(29.0, 49.0, 9.0), (29.5, 49.5, 9.5)],
    },
    "wmt": {"unigram": [(25.0, 45.0, 7.0), (26.0, 46.0, 8.0)]},
}


def _valid_log(bleu, updates=(1000, 5000, 30000)):
    return "".join(
        f"2026-01-01 10:00:00 | INFO | valid | epoch {i:03d} | valid on 'valid' subset | "
        f"loss 4.5 | bleu {bleu} | num_updates {u}\n"
        for i, u in enumerate(updates, start=1)
    )


def _write_grid(root):
    for dataset, inits in GRID.items():
        for init, seeds in inits.items():
            for seed, (bleu, chrf, valid) in enumerate(seeds, start=1):
                run = root / dataset / init / f"seed{seed}"
                run.mkdir(parents=True)
                (run / "train.log").write_text(_valid_log(valid))
                (run / "test.bleu.json").write_text(
                    json.dumps({"name": "BLEU", "score": bleu, "signature": "nrefs:1|tok:13a"})
                )
                (run / "test.chrf.json").write_text(f"{chrf}\n")  # sacrebleu -b output
    return root


def _stderr(values):
    return statistics.stdev(values) / math.sqrt(len(values))


@pytest.fixture(scope="session")
def grid(tmp_path_factory):
    """A read-only run grid; tests that change files write their own."""
    return _write_grid(tmp_path_factory.mktemp("grid") / "runs")


def test_means_and_standard_errors_per_dataset_and_init(grid):
    result = report.build_report([str(grid)], max_updates=20000)
    groups = {(g.dataset, g.init): g for g in result.groups}
    assert list(groups) == [("iwslt", "zero"), ("iwslt", "unigram"), ("wmt", "unigram")]
    for (dataset, init), group in groups.items():
        seeds = GRID[dataset][init]
        for index, summary in (
            (0, group.test["bleu"]),
            (1, group.test["chrf"]),
            (2, group.alc["bleu"]),
        ):  # constant curve: ALC = its value
            values = [s[index] for s in seeds]
            assert summary.mean == pytest.approx(statistics.mean(values))
            assert summary.stderr == pytest.approx(_stderr(values))
            assert summary.n == len(values)
    assert groups["iwslt", "unigram"].alc["chrf"].n == 0  # the logs have no chrf


def test_markdown_table_plots_and_missing_inputs(tmp_path, capsys):
    grid = _write_grid(tmp_path / "runs")
    (grid / "iwslt" / "zero" / "seed2" / "test.bleu.json").unlink()
    (grid / "iwslt" / "zero" / "seed2" / "train.log").write_text("no validation here\n")
    out = tmp_path / "out"
    report_cli.report_main([str(grid), "--out-dir", str(out)])
    table = (out / "report.md").read_text()
    unigram = [s[0] for s in GRID["iwslt"]["unigram"]]
    expected = f"{statistics.mean(unigram):.2f} ± {_stderr(unigram):.2f} (n=3)"
    assert f"| iwslt | unigram | 3 | {expected} |" in table
    assert "| iwslt | zero | 2 | 29.00 (n=1) |" in table  # one seed left with a score
    assert "no test BLEU" in table and "no validation lines" in table
    assert "signature: `nrefs:1|tok:13a`" in table
    for name in ("test_bleu.png", "test_chrf.png", "alc_bleu.png"):
        assert (out / name).stat().st_size > 10_000
    assert not (out / "alc_chrf.png").exists()  # nothing to plot: no empty figure
    assert len((out / "runs.tsv").read_text().splitlines()) == 1 + 7
    assert "wrote" in capsys.readouterr().out


def test_sacrebleu_json_output_is_read_as_written(tmp_path):
    from sacrebleu.metrics import BLEU, CHRF

    hyp, ref = ["the cat sat on mat", "a dog barks"], ["the cat sat on the mat", "a dog"]
    (tmp_path / "hyp").write_text("\n".join(hyp) + "\n")
    (tmp_path / "ref").write_text("\n".join(ref) + "\n")
    run = tmp_path / "seed1"
    run.mkdir()
    sacrebleu = [str(BIN / "sacrebleu"), str(tmp_path / "ref"), "-i", str(tmp_path / "hyp")]
    for metrics, name in ((["bleu"], "test.bleu.json"), (["bleu", "chrf"], "test.json")):
        written = subprocess.run(sacrebleu + ["-m", *metrics], capture_output=True, text=True)
        (run / name).write_text(written.stdout)
    bleu = runs.read_test_score(str(run), "bleu")
    chrf = runs.read_test_score(str(run), "chrf")  # from the list in test.json
    assert bleu.value == round(BLEU().corpus_score(hyp, [ref]).score, 1)
    assert chrf.value == round(CHRF().corpus_score(hyp, [ref]).score, 1)
    assert bleu.signature.startswith("nrefs:1|case:mixed") and "chrF" not in bleu.signature


def test_single_dataset_grid_is_named_after_its_root_or_as_given(tmp_path):
    run = tmp_path / "multi30k" / "unigram" / "seed_1"
    run.mkdir(parents=True)
    (run / "test.bleu.json").write_text("35.5")
    found = runs.discover_runs([str(tmp_path / "multi30k")])
    assert [(r.dataset, r.init, r.seed) for r in found] == [("multi30k", "unigram", 1)]
    named = runs.discover_runs([f"m30k={tmp_path / 'multi30k'}"])
    assert [(r.dataset, r.init, r.seed) for r in named] == [("m30k", "unigram", 1)]


def test_unusable_grids_are_refused_with_a_reason(tmp_path):
    with pytest.raises(NaturalBiasError, match="no run directories"):
        report.build_report([str(tmp_path)])
    (tmp_path / "d" / "unigram" / "seed1").mkdir(parents=True)
    with pytest.raises(NaturalBiasError, match="no test scores and no validation curves"):
        report.build_report([str(tmp_path)])
    (tmp_path / "d" / "unigram" / "seed1" / "test.bleu.json").write_text(
        '{"name": "chrF2", "score": 3}'
    )
    with pytest.raises(NaturalBiasError, match="holds a chrF2 score where bleu"):
        report.build_report([str(tmp_path)])


def test_console_script_help():
    """The installed script runs this package's main; --help describes the tool."""
    assert "RUNS/<dataset>/<init>/seed<k>/" in console_script_help("natbias-report")
