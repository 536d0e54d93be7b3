"""research/reach_from_records.py against a hand-worked record."""

import json

import pytest
from research_scripts import benchmark_script


def test_reach_is_interpolated_and_scaled_by_the_horizon(tmp_path, capsys):
    reach = benchmark_script("reach_from_records")
    record = tmp_path / "seed1.json"
    # 4.0 at 600, 3.9 at 700: 3.973 is reached at 600 + 100 * 0.027 / 0.1 = 627.
    record.write_text(
        json.dumps(
            {
                "updates": [0, 600, 700, 1000],
                "nll": [8.0, 4.0, 3.9, 3.7],
                "scores": {"bleu": 30.0, "chrf": 50.0},
                "gain": 1.0,
            }
        )
    )
    reach.main(["--target", "3.973", "--horizon", "1000", str(record)])
    out = capsys.readouterr().out
    assert f"| {record} | 627 (0.63x) | 3.700 | BLEU 30.00 / chrF 50.00 | 1.00 |" in out
    with pytest.raises(SystemExit, match="no run record"):
        reach.main(["--target", "3.9", str(tmp_path / "absent.json")])
