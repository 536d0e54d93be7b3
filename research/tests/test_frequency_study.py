"""research/frequency_study.py: the combining over seeds, against values worked by hand."""

import math

import pytest
from research_scripts import benchmark_script


def rows(*medians):
    """One seed's CSV rows (strings, as csv.DictReader gives them) for bins 1-50 and >=51."""
    return [
        {"bin": label, "tokens": "40", "median_difference_bits": value}
        for label, value in zip(("1-50", ">=51"), medians)
    ]


def test_mean_and_standard_error_per_bin_over_seeds():
    study = benchmark_script("frequency_study")
    # bin 1-50: -0.1, -0.3, -0.2: mean -0.2, s.d. 0.1, s.e. 0.1 / sqrt(3);
    # bin >=51: 0.4 and 0.0 (the third seed left it empty): mean 0.2, s.d.
    # sqrt(0.08), s.e. sqrt(0.08) / sqrt(2) = 0.2.
    combined = study.combine_bins(
        [rows("-0.1", "0.4"), rows("-0.3", "0.0"), rows("-0.2", "")], ("median_difference_bits",)
    )
    assert [row["bin"] for row in combined] == ["1-50", ">=51"]
    mean, error = combined[0]["median_difference_bits"]
    assert mean == pytest.approx(-0.2) and error == pytest.approx(0.1 / math.sqrt(3))
    mean, error = combined[1]["median_difference_bits"]
    assert mean == pytest.approx(0.2) and error == pytest.approx(0.2)
    assert combined[1]["median_difference_bits_seeds"] == 2
    assert study.cell(combined[0]["median_difference_bits"]) == "-0.200 ± 0.058"


def test_one_seed_has_no_spread_and_seeds_must_share_bins():
    study = benchmark_script("frequency_study")
    mean, error = study.combine_bins([rows("-0.1", "0.4")], ("median_difference_bits",))[0][
        "median_difference_bits"
    ]
    assert mean == pytest.approx(-0.1) and math.isnan(error)
    other = [{**row, "bin": "x"} for row in rows("0", "0")]
    with pytest.raises(SystemExit, match="disagree on the bins"):
        study.combine_bins([rows("0", "0"), other], ("median_difference_bits",))
