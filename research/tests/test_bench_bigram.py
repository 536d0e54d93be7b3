"""research/bench_bigram.py: its three arms train on the same batches, and
its table reads each arm's ratios against stock and order 1."""

import argparse

import pytest
from research_scripts import benchmark_script


@pytest.mark.training
def test_three_arms_on_the_same_batches_give_each_ratio(toy_bin_joined, tmp_path):
    script = benchmark_script("bench_bigram")
    args = argparse.Namespace(
        layers=1, dim=16, ffn=16, heads=2, max_tokens=256, warmup=1, updates=4, block=2
    )
    record = script.measure(toy_bin_joined, args, tmp_path)
    rows = record["arms"]
    assert list(rows) == [script.STOCK, script.ORDER1, script.ORDER2]
    assert rows[script.STOCK]["vs_stock"] == 1.0 and "vs_order1" not in rows[script.STOCK]
    assert rows[script.ORDER1]["vs_order1"] == 1.0 == rows[script.ORDER1]["paired_vs_order1"]
    assert all(row["median_s"] > 0 for row in rows.values())
    lines = script.table(record).splitlines()
    assert lines[0].startswith(f"|V| = {record['vocab']:,};")
    assert lines[-1].startswith(f"| {script.ORDER2} | ") and lines[-1].endswith("x) |")
