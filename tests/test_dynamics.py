"""natbias-dynamics: per-init curves over updates, mean ± standard error over seeds."""

import math
import statistics

import pytest
from natbias_testing import console_script_help

from natbias.errors import NaturalBiasError
from natbias.tools import cli as dynamics_cli
from natbias.tools import dynamics, runs

UPDATES = (1, 2, 4, 8)


def _log(bias_kl, kl_unigram, bleu, updates=UPDATES):
    """fairseq simple-format lines as transformer_natbias writes them."""
    lines = []
    for i, u in enumerate(updates):
        bias = "" if bias_kl is None else f", bias_norm=30.0, bias_kl={bias_kl[i]}"
        lines.append(
            f"2026-01-01 10:00:00 | INFO | train_inner | epoch 001:  {u:5d} / 8 "
            f"loss=4.4, kl_unigram={kl_unigram[i]}, kl_uniform=1.2{bias}, "
            f"num_updates={u}, lr=0.0001"
        )
        if u >= 4:
            lines.append(
                f"2026-01-01 10:00:00 | INFO | valid | epoch 001 | valid on 'valid' "
                f"subset | loss 4.5 | bleu {bleu * u} | num_updates {u}"
            )
    return "\n".join(lines) + "\n"


SEEDS = {  # init -> per seed (bias_kl, kl_unigram, bleu slope)
    "unigram": [([0.1] * 4, [0.5, 0.4, 0.3, 0.2], 1.0), ([0.3] * 4, [0.7, 0.6, 0.5, 0.4], 2.0)],
    "none": [(None, [2.0, 1.0, 0.5, 0.25], 0.5)],
}


@pytest.fixture(scope="session")
def grid(tmp_path_factory):
    root = tmp_path_factory.mktemp("dynamics")
    for init, seeds in SEEDS.items():
        for k, (bias_kl, kl, bleu) in enumerate(seeds, start=1):
            run = root / "runs" / "toy" / init / f"seed{k}"
            run.mkdir(parents=True)
            updates = UPDATES[:3] if (init, k) == ("unigram", 2) else UPDATES  # stopped early
            (run / "train.log").write_text(_log(bias_kl, kl, bleu, updates))
    return root / "runs"


def test_seed_means_and_standard_errors_update_by_update(grid):
    result = dynamics.collect(
        runs.discover_runs([str(grid)]), ["bias_kl", "kl_unigram", "valid_bleu"]
    )
    unigram_kl = {c.label: c for c in result.curves["kl_unigram"]["toy"]}["unigram"]
    assert unigram_kl.x.tolist() == [1, 2, 4, 8]
    assert unigram_kl.seeds.tolist() == [2, 2, 2, 1]  # seed 2 stopped after update 4
    for i, (a, b) in enumerate(zip([0.5, 0.4, 0.3], [0.7, 0.6, 0.5])):
        assert unigram_kl.mean[i] == pytest.approx((a + b) / 2)
        assert unigram_kl.high[i] - unigram_kl.mean[i] == pytest.approx(
            statistics.stdev([a, b]) / math.sqrt(2)
        )
    assert unigram_kl.mean[3] == pytest.approx(0.2) and unigram_kl.low[3] == unigram_kl.high[3]
    bleu = {c.label: c for c in result.curves["valid_bleu"]["toy"]}
    assert bleu["unigram"].x.tolist() == [4, 8]
    assert bleu["unigram"].mean.tolist() == pytest.approx([(4 + 8) / 2, 8])
    assert bleu["none"].mean.tolist() == pytest.approx([2, 4])
    assert [c.label for c in result.curves["bias_kl"]["toy"]] == ["unigram"]
    assert any("none: no bias_kl" in n and "without an output bias" in n for n in result.notes)


def test_cli_writes_one_plot_per_metric_and_the_numbers(grid, tmp_path, capsys):
    out = tmp_path / "out"
    dynamics_cli.dynamics_main([str(grid), "--out-dir", str(out)])
    for metric in dynamics.DEFAULT_METRICS:
        assert (out / f"{metric}.png").stat().st_size > 10_000
    rows = (out / "dynamics.tsv").read_text().splitlines()
    assert "bias_kl\ttoy\tunigram\t1\t0.2\t0.1\t2" in rows
    assert "note: toy/none: no bias_kl" in capsys.readouterr().out


def test_single_logs_and_missing_metrics(tmp_path, capsys):
    log = tmp_path / "a.log"
    log.write_text(_log([0.1] * 4, [0.5] * 4, 1.0))
    dynamics_cli.dynamics_main(
        ["--log", f"unigram={log}", "--metrics", "bias_norm", "--out-dir", str(tmp_path / "out")]
    )
    assert (tmp_path / "out" / "bias_norm.png").exists()
    with pytest.raises(NaturalBiasError, match="none of valid_chrf is in any log"):
        dynamics.collect(dynamics_cli.single_log_runs([f"unigram={log}"]), ["valid_chrf"])
    with pytest.raises(SystemExit, match="expected INIT=LOG"):
        dynamics_cli.dynamics_main(["--log", str(log), "--out-dir", str(tmp_path / "out")])


def test_console_script_help():
    """The installed script runs this package's main; --help describes the tool."""
    assert "log-scale" in console_script_help("natbias-dynamics")
