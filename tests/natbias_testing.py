"""Shared helpers for the tests: tiny model settings and the real fairseq CLIs."""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# Where the real parallel text lives: ../shared beside the checkout, or a path
# given in NATBIAS_MULTI30K.
MULTI30K = Path(os.environ.get("NATBIAS_MULTI30K", REPO.parent / "shared/data/multi30k"))

TINY_MODEL = [
    "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
    "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]

TINY_TRAINING = [
    "--cpu", "--seed", "1", "--num-workers", "0",
    "--optimizer", "adam", "--adam-betas", "(0.9, 0.997)", "--lr", "1e-3",
    "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10",
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
    "--max-tokens", "2000", "--log-format", "simple", "--log-interval", "1",
    "--no-epoch-checkpoints", "--no-progress-bar",
]


def fairseq(tool, *args, cwd=None, check=True, env=None):
    """Run a real fairseq entry point (fairseq-train, fairseq-generate, ...)."""
    full_env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    full_env.update(env or {})
    result = subprocess.run(
        [str(BIN / tool), *map(str, args)],
        cwd=cwd or REPO, env=full_env, capture_output=True, text=True,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{tool} failed ({result.returncode}):\n{result.stdout[-4000:]}\n"
            f"{result.stderr[-6000:]}"
        )
    return result


def train(data, save_dir, *extra, arch="transformer_natbias", cwd=None, check=True,
          model=TINY_MODEL, max_update=4):
    return fairseq(
        "fairseq-train", data, "--user-dir", "fairseq_natbias", "--arch", arch,
        *model, *TINY_TRAINING, "--save-dir", save_dir,
        "--max-update", max_update, *extra, cwd=cwd, check=check,
    )


def log_records(text, tag):
    """Parse fairseq's simple-format log lines with this tag into dicts."""
    records = []
    for line in text.splitlines():
        if f"| {tag} |" not in line:
            continue
        body = line.split(f"| {tag} |", 1)[1]
        record = {}
        for key, value in re.findall(r"(\w+)[ =]([-+\d.eE]+|inf|nan)(?=,|\s*\||\s*$)", body):
            try:
                record[key] = float(value)
            except ValueError:
                pass
        records.append(record)
    return records
