"""Reach of a fixed validation NLL from the study's run records: for runs
trained without their stock arm beside them (issue 36's capped gain on the
full corpus, against the stock runs of an earlier study whose figures are
committed), the update at which each run's validation NLL first falls to
``--target`` (interpolated, as the study's "updates to reach"), as a fraction
of ``--horizon``, with the run's NLL at the horizon and its test scores.

    .venv/bin/python research/reach_from_records.py --target 3.973 --horizon 1000 \\
        --label "De-En, stock's mean at 1,000 (de-en_short_study.md)" \\
        research/results/runs/de-en_short/gain_0.05_20_capped-unigram/seed*.json
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "research"))

from study.summary import reach  # noqa: E402


def row(path, target, horizon):
    record = json.loads(Path(path).read_text())
    reached = reach(record, target)
    scores = record["scores"]
    score = (
        f"BLEU {scores['bleu']:.2f} / chrF {scores['chrf']:.2f}"
        if "bleu" in scores
        else f"ppl {scores['ppl']:.2f}"
    )
    cell = "never" if reached == float("inf") else f"{reached:.0f} ({reached / horizon:.2f}x)"
    gain = record.get("gain")
    at_horizon = np.interp(horizon, record["updates"], record["nll"])
    return (
        f"| {path} | {cell} | {at_horizon:.3f} | {score} | "
        f"{'' if gain is None else f'{gain:.2f}'} |"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "records", nargs="+", help="run records (the study's runs/.../seed<k>.json)"
    )
    parser.add_argument(
        "--target", type=float, required=True, help="validation NLL to reach (bits)"
    )
    parser.add_argument("--horizon", type=int, default=1000, help="the reach's denominator")
    parser.add_argument("--label", default="", help="where the target comes from")
    args = parser.parse_args(argv)
    missing = [path for path in args.records if not Path(path).is_file()]
    if missing:
        raise SystemExit(f"reach_from_records: no run record at {', '.join(missing)}")
    print(f"Target {args.target:.3f} bits{': ' + args.label if args.label else ''}\n")
    print(
        f"| run record | update reaching it (of {args.horizon:,}) | valid NLL at "
        f"{args.horizon:,} | test score (best checkpoint) | gain g at the end |"
    )
    print("|---|---|---|---|---|")
    for path in args.records:
        print(row(path, args.target, args.horizon))


if __name__ == "__main__":
    main()
