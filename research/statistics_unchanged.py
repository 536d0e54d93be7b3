"""Every statistic a user reads, from this checkout and from another revision,
compared to the last bit: a refactoring of natbias.statistics or of the
engines' logging must leave them all equal.

    python research/statistics_unchanged.py --base main

Compared (each tree's own code, in a process of its own, on the same toy data
and models): fairseq-train's train_inner, train and valid lines (the default,
--update-freq 2, --natbias-order 2, --natbias-init none; every key but the
timings), natbias-step0's figures unrounded (one batch and several),
natbias.hf's statistics with a probe (unrounded and as the Trainer logs them)
and what natbias.olmo_core's callback records. Exits 1 if anything differs.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMINGS = ("wps", "ups", "wpb", "bsz", "wall", "train_wall", "gb_free")
FAIRSEQ_RUNS = {
    "default": [],
    "update-freq-2": ["--update-freq", "2"],
    "order-2": ["--update-freq", "2", "--natbias-order", "2"],
    "init-none": ["--natbias-init", "none"],
}


def probe(data: Path) -> dict:
    """The statistics of this process's tree (its cwd), as JSON-able values
    (floats as repr, every bit of them)."""
    sys.path.insert(0, "tests")
    import torch
    from natbias_fixtures import _synthetic_pairs, _write, preprocess
    from natbias_testing import TINY_MODEL, TINY_TRAINING, build_in_process, log_records

    if not (data / "bin").exists():
        for split, n, seed in (("train", 400, 1), ("valid", 40, 2), ("test", 20, 3)):
            pairs = _synthetic_pairs(n, seed, src_vocab=40, tgt_vocab=30)
            (data / "text").mkdir(parents=True, exist_ok=True)
            _write(data / "text" / f"{split}.src", [p[0] for p in pairs])
            _write(data / "text" / f"{split}.tgt", [p[1] for p in pairs])
        preprocess(data / "text", data / "bin")
    out = {}
    train = Path(sys.executable).parent / "fairseq-train"
    for name, extra in FAIRSEQ_RUNS.items():
        with tempfile.TemporaryDirectory() as save:
            command = [train, data / "bin", "--user-dir", "fairseq_natbias"]
            command += ["--arch", "transformer_natbias", *TINY_MODEL, *TINY_TRAINING]
            command += ["--save-dir", save, "--max-update", "8", *extra]
            run = subprocess.run(
                list(map(str, command)), capture_output=True, text=True, check=True
            )
        for tag in ("train_inner", "train", "valid"):
            records = log_records(run.stdout + run.stderr, tag)
            out[f"fairseq {name} {tag}"] = [
                {k: v for k, v in r.items() if k not in TIMINGS} for r in records
            ]
    from fairseq_natbias.in_process import validation_divergence

    with tempfile.TemporaryDirectory() as save:
        task, model, _ = build_in_process(data / "bin", save)
        for name, max_tokens in (("one batch", 4000), ("batches", 100)):
            result = validation_divergence(task, model, max_tokens=max_tokens)
            out[f"natbias-step0 {name}"] = {k: repr(v) for k, v in result.items()}

    from hf_tiny import build, zipf_targets

    import natbias.hf
    from natbias.hf.callback import statistics

    model = natbias.hf.add_natural_bias(build("gpt2"), zipf_targets()).eval()
    ids = [t + [0] * (16 - len(t)) for t in (t[:16] for t in zipf_targets(8, seed=1))]
    ids = torch.tensor(ids)
    batch = {"input_ids": ids, "attention_mask": ids.ne(0).long()}
    batch["labels"] = ids.masked_fill(ids.eq(0), -100)
    out["natbias.hf unrounded"] = {
        k: repr(v) for k, v in statistics(model, batch, None, None).items()
    }
    out["natbias.hf logged"] = statistics(model, batch)

    from olmo_core.nn.transformer import TransformerConfig

    from natbias.olmo_core import add_natural_bias
    from natbias.olmo_core.callback import statistics as olmo_statistics

    torch.manual_seed(0)
    model = TransformerConfig.olmo2_1M(vocab_size=1024).build(init_device="cpu")
    add_natural_bias(model, counts=[1 + (7 * i) % 50 for i in range(1024)])
    out["natbias.olmo_core"] = {k: repr(v) for k, v in olmo_statistics(model).items()}
    return out


def measured(tree: Path, data: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    command = [sys.executable, str(REPO / "research" / Path(__file__).name), "--probe", str(data)]
    run = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    if run.returncode:
        sys.exit(f"statistics_unchanged: {tree} failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="main", help="the revision to compare with")
    parser.add_argument("--probe", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe(args.probe)))
        return
    with tempfile.TemporaryDirectory() as work:
        base, data = Path(work) / "base", Path(work) / "data"
        base.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", args.base], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
        theirs, ours = measured(base, data), measured(REPO, data)
    differ = [key for key in theirs.keys() | ours.keys() if theirs.get(key) != ours.get(key)]
    for key in ours:
        values = ours[key]
        count = sum(len(r) for r in values) if isinstance(values, list) else len(values)
        print(f"{key}: {count} values, {'DIFFER' if key in differ else 'identical'}")
    if differ:
        sys.exit(
            f"statistics_unchanged: {len(differ)} of {len(theirs)} groups differ from {args.base}"
        )
    print(f"every value identical to {args.base}'s")


if __name__ == "__main__":
    main()
