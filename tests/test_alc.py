"""ALC: composite trapezoidal rule over the first K updates, divided by the span."""

import math

import pytest
from natbias_testing import console_script_help

from natbias.errors import NaturalBiasError
from natbias.tools import alc
from natbias.tools import cli as alc_cli
from natbias.tools.stats import mean_stderr

# A piecewise-linear validation curve: (update, BLEU).
CURVE = [(1000, 2.0), (2000, 6.0), (4000, 6.0), (5000, 10.0)]


def _curve(points=CURVE):
    return [p[0] for p in points], [p[1] for p in points]


def test_alc_of_a_piecewise_linear_curve_cut_between_two_points():
    # K = 4500: the curve is 8.0 there (halfway from 6 to 10). Trapezoids:
    # 1000-2000: (2+6)/2*1000 = 4000; 2000-4000: 6*2000 = 12000;
    # 4000-4500: (6+8)/2*500 = 3500; span 4500-1000 = 3500.
    result = alc.area_under_learning_curve(*_curve(), max_updates=4500)
    assert result.area == pytest.approx(4000 + 12000 + 3500)
    assert result.alc == pytest.approx((4000 + 12000 + 3500) / 3500)
    assert (result.first_update, result.last_update, result.points) == (1000, 4500, 4)
    assert result.covers_max_updates


def test_alc_on_a_validation_point_and_beyond_the_end():
    at_point = alc.area_under_learning_curve(*_curve(), max_updates=4000)
    assert at_point.alc == pytest.approx((4000 + 12000) / 3000)
    whole = alc.area_under_learning_curve(*_curve(), max_updates=20000)
    assert whole.alc == pytest.approx((4000 + 12000 + 8000) / 4000)
    assert not whole.covers_max_updates  # the run stopped at 5000
    assert alc.area_under_learning_curve(*_curve(), max_updates=None).alc == whole.alc


def test_a_constant_curve_has_its_value_as_alc():
    result = alc.area_under_learning_curve([500, 700, 2000], [3.5, 3.5, 3.5], 1500)
    assert result.alc == pytest.approx(3.5)


@pytest.mark.parametrize(
    "updates, values, limit, message",
    [
        ([1000, 2000], [1.0, 2.0], 1000, "1 validation point"),
        ([3000, 4000], [1.0, 2.0], 2000, "first validation is at update 3000"),
        ([2000, 1000], [1.0, 2.0], None, "strictly increasing"),
        ([1000, 2000], [1.0, math.nan], None, "non-finite"),
    ],
)
def test_unusable_curves_are_refused_with_a_reason(updates, values, limit, message):
    with pytest.raises(NaturalBiasError, match=message):
        alc.area_under_learning_curve(updates, values, limit)


def test_mean_and_standard_error_over_seeds():
    # mean 7/3; sample variance ((4/3)^2 + (1/3)^2 + (5/3)^2) / 2 = 7/3;
    # standard error sqrt(7/3 / 3) = sqrt(7) / 3.
    summary = mean_stderr([1.0, 2.0, 4.0])
    assert summary.mean == pytest.approx(7 / 3)
    assert summary.stderr == pytest.approx(math.sqrt(7) / 3)
    assert summary.n == 3
    assert math.isnan(mean_stderr([5.0]).stderr)


def _simple_log(points, extra=""):
    lines = [
        f"2026-01-01 10:00:00 | INFO | valid | epoch {i:03d} | valid on 'valid' "
        f"subset | loss 4.5 | bleu {bleu} | num_updates {update}"
        for i, (update, bleu) in enumerate(points, start=1)
    ]
    return extra + "\n".join(lines) + "\n"


def _json_log(points):
    return "".join(
        f'2026-01-01 10:00:00 | INFO | valid | {{"epoch": {i}, "valid_loss": "4.5", '
        f'"valid_bleu": "{bleu}", "valid_num_updates": "{update}"}}\n'
        for i, (update, bleu) in enumerate(points, start=1)
    )


def test_alc_of_logs_in_both_formats(tmp_path):
    (tmp_path / "simple.log").write_text(_simple_log(CURVE))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "train.log").write_text(_json_log(CURVE))
    expected = (4000 + 12000 + 3500) / 3500
    assert alc.alc_of_log(str(tmp_path / "simple.log"), "bleu", 4500).alc == pytest.approx(expected)
    assert alc.alc_of_log(str(run_dir), "bleu", 4500).alc == pytest.approx(expected)


def test_cli_prints_each_run_and_mean_with_standard_error(tmp_path, capsys):
    # Two seeds: the curve above (ALC 24000/4000 = 6 over all of it) and the
    # same curve + 2 BLEU everywhere (ALC 8). Mean 7, standard error 1.
    (tmp_path / "a.log").write_text(_simple_log(CURVE))
    (tmp_path / "b.log").write_text(_simple_log([(u, b + 2) for u, b in CURVE]))
    alc_cli.alc_main([str(tmp_path / "a.log"), str(tmp_path / "b.log"), "--max-updates", "0"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split("\t")[1].startswith("6.0000")
    assert lines[1].split("\t")[1].startswith("8.0000")
    assert lines[-1].endswith("7.0000 ± 1.0000 (n=2)")


def test_cli_without_validation_lines_says_so_without_traceback(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(
        "2026-01-01 10:00:01 | INFO | train_inner | epoch 001:      1 / 2 loss=4.4, num_updates=1\n"
    )
    with pytest.raises(SystemExit) as exit_info:
        alc_cli.alc_main([str(log)])
    message = str(exit_info.value.code)  # sys.exit(message): printed alone, no traceback
    assert message.startswith("natbias-alc: error:") and "no validation lines" in message


def test_console_script_help():
    """The installed script runs this package's main; --help describes the tool."""
    assert "trapezoidal" in console_script_help("natbias-alc")
