"""What `pip install ".[hf]"` resolves to on each Python given, without installing:
the check behind installation.md's claim that the core and the transformers
extra install on Python 3.10-3.13 without fairseq or its runtime needs.

    python research/install_matrix.py /root/.pyenv/versions/3.10.13/bin/python \\
        /root/.pyenv/versions/3.13.0/bin/python --out research/results/install_matrix.md

Each Python runs `pip install --dry-run --ignore-installed --report` on this
checkout with the given extra (needs the package index); the table says
whether it resolved, the torch and transformers it chose, and which of
fairseq's needs it would pull in (none is the goal).
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAIRSEQ_NEEDS = {
    "fairseq",
    "ve-fairseq",
    "hydra-core",
    "omegaconf",
    "bitarray",
    "cython",
    "scikit-learn",
}


def resolve(python, extra):
    """(python version, {name: version}) pip would install, or an error line."""
    version = subprocess.run(
        [python, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        done = subprocess.run(
            [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q"]
            + ["--disable-pip-version-check", "--report", str(report), f"{REPO}[{extra}]"],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            return version, done.stderr.strip().splitlines()[-1]
        chosen = json.loads(report.read_text())["install"]
    return version, {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in chosen}


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("pythons", nargs="+", help="Python interpreters to resolve with")
    parser.add_argument("--extra", default="hf", help="the extra to install (default: hf)")
    parser.add_argument("--out", help="also write the table here (Markdown)")
    args = parser.parse_args(argv)
    rows = [
        f'| Python | `pip install ".[{args.extra}]"` | torch | transformers | fairseq\'s needs pulled in |',
        "|---|---|---|---|---|",
    ]
    for python in args.pythons:
        print(f"resolving with {python} ...", file=sys.stderr, flush=True)
        version, chosen = resolve(python, args.extra)
        if isinstance(chosen, str):
            rows.append(f"| {version} | fails: {chosen} | | | |")
            continue
        pulled = sorted(FAIRSEQ_NEEDS & set(chosen)) or ["none"]
        rows.append(
            f"| {version} | resolves ({len(chosen)} packages) | {chosen.get('torch', '-')} "
            f"| {chosen.get('transformers', '-')} | {', '.join(pulled)} |"
        )
    table = "\n".join(rows)
    print(table)
    if args.out:
        command = "python research/install_matrix.py " + " ".join(args.pythons)
        Path(args.out).write_text(
            f"# What `pip install` resolves, by Python\n\n`{command}`\n\n{table}\n"
        )


if __name__ == "__main__":
    main()
