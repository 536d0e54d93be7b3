"""make demo (python examples/paper/demo.py): what a user gets, in miniature, on the CPU.

SentencePiece (joint) -> fairseq-preprocess -> three small models with the same
sizes, seed and batches: transformer_natbias with its default settings, the
same with --natbias-init zero, and fairseq's --arch transformer (--arms picks
fewer) -> fairseq-generate (beam 5) -> a table of validation NLL over updates
and test BLEU/chrF (sacreBLEU), and a plot. Finished steps are skipped; an
interrupted training resumes from its last checkpoint.

Data (German->English): --data DIR holding {train,val,test_2016_flickr}.{de,en}
(or train/valid/test), plain or .gz; else $NATBIAS_MULTI30K (which make demo
sets to ../shared/data/multi30k when that is there); else Multi30k downloaded;
else a small synthetic corpus, announced as such.
"""

import argparse
import time
from pathlib import Path

import multi30k
import pipeline
from pipeline import say

from natbias.tools import plots

# The runs compared: name -> model options.
ARMS = {
    "unigram": ["--arch", "transformer_natbias"],  # the defaults: unigram bias, gain init
    "zero": ["--arch", "transformer_natbias", "--natbias-init", "zero"],
    "stock": ["--arch", "transformer"],  # fairseq's own, what a user would otherwise run
}
# What each arm is, for the report's footnote.
ARM_NOTES = {
    "unigram": "transformer_natbias with its default settings",
    "zero": "the same with --natbias-init zero",
    "stock": "fairseq's --arch transformer, same sizes",
}


def find_raw_data(given, work):
    try:
        return multi30k.find_raw_data(given, work, say=say)
    except multi30k.DataError as error:
        raise SystemExit(f"demo.py: error: {error}") from None


def train(data_bin, run_dir, init, max_update):
    """Train the arm ``init`` (a key of ARMS) for max_update updates."""
    if (run_dir / "done").exists():
        say(f"train [{init}]: finished before, skipped")
        return
    say(
        f"train [{init}]: {max_update} updates on the CPU "
        f"(resumes from {run_dir}/checkpoint_last.pt if present)"
    )
    progress = pipeline.on_validation(
        "nll_loss",
        lambda record: say(
            f"train [{init}]: update {record.num_updates}/{max_update} "
            f"valid NLL {record.values['nll_loss']} bits"
        ),
    )
    options = [*ARMS[init], *pipeline.MODEL, *pipeline.TRAINING]
    pipeline.train(
        pipeline.train_command(data_bin, run_dir, options, max_update), run_dir, progress
    )


def report(work, results):
    """report.md and valid_nll.png of the arms in ``results``, in its order."""
    arms = list(results)
    curves = {init: pipeline.validation_curve(work / init) for init in arms}
    updates = sorted(set().union(*curves.values()))
    lines = [
        "## Validation NLL (bits/token) over updates",
        "",
        "| update | " + " | ".join(arms) + " |",
        "|---|" + "---|" * len(arms),
    ]
    for update in updates:
        cells = [f"{curves[i][update]:.3f}" if update in curves[i] else "" for i in arms]
        lines.append(f"| {update} | " + " | ".join(cells) + " |")
    lines += ["", "## Test (best checkpoint, beam 5)", "", "| run | BLEU | chrF |", "|---|---|---|"]
    for init in arms:
        lines.append(f"| {init} | {results[init]['bleu']} | {results[init]['chrf']} |")
    first = results[arms[0]]
    lines += [
        "",
        "; ".join(f"{arm}: {ARM_NOTES[arm]}" for arm in arms) + ".",
        "",
        f"BLEU signature: `{first['bleu_signature']}`",
        f"chrF signature: `{first['chrf_signature']}`",
    ]
    table = "\n".join(lines) + "\n"
    (work / "report.md").write_text(table)
    panel = []
    for init, curve in curves.items():
        y = [curve[u] for u in sorted(curve)]
        panel.append({"label": init, "x": sorted(curve), "mean": y, "low": y, "high": y})
    plots.curve_panels(
        {"Multi30k De-En (demo)": panel},
        "validation NLL (bits/token)",
        str(work / "valid_nll.png"),
        logx=False,
    )
    return table


def main(argv=None):
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="examples/paper/demo.py", description=__doc__, formatter_class=raw
    )
    parser.add_argument("--data", help="folder of raw parallel text (see above)")
    parser.add_argument(
        "--output", default="demo_output", help="work folder (default: %(default)s)"
    )
    parser.add_argument("--max-update", type=int, default=250)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument(
        "--arms",
        nargs="+",
        choices=list(ARMS),
        default=list(ARMS),
        help="the runs to train and compare (default: all three; "
        "e.g. --arms unigram stock for a quicker demo)",
    )
    args = parser.parse_args(argv)
    arms = [arm for arm in ARMS if arm in args.arms]  # the table's order, each once
    work = Path(args.output).resolve()
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    raw = find_raw_data(args.data, work)
    data_bin = pipeline.prepare(raw, work, args.vocab_size)
    results = {}
    for init in arms:
        train(data_bin, work / init, init, args.max_update)
        results[init] = pipeline.evaluate(data_bin, work, work / init, init)
    print("\n" + report(work, results))
    say(
        f"done in {time.time() - started:.0f} s; outputs in {work}: report.md, "
        f"valid_nll.png, {{{','.join(arms)}}}/train.log, checkpoints, test.hyp"
    )


if __name__ == "__main__":
    main()
