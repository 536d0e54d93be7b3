"""Tests write under their temporary directories only: what a test run added
to the working tree. tests/conftest.py checks the whole run with it (the
controller's session, after every xdist worker has finished) and fails the
run on anything new but caches."""

import os
import subprocess

# Caches any Python or tool run leaves; the virtual environment make installs.
CACHES = {"__pycache__", ".pytest_cache", ".ruff_cache", ".venv"}


def state(repo):
    """What is in the working tree: the lines of ``git status --porcelain
    --ignored``, and "++ PATH" for every
    file and folder on disk, caches and .git left out (git shows no empty
    folder, the kind a test's ``output_dir="unused"`` leaves)."""
    lines = set()
    try:
        result = subprocess.run(
            ["git", "status", "--porcelain", "--ignored"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if result.returncode == 0:  # else not a git checkout: the files alone
            lines.update(result.stdout.splitlines())
    except (OSError, subprocess.TimeoutExpired):
        pass
    for folder, dirs, files in os.walk(repo):
        dirs[:] = [d for d in dirs if d not in CACHES and d != ".git"]
        here = os.path.relpath(folder, repo)
        lines.update("++ " + os.path.normpath(os.path.join(here, d)) + "/" for d in dirs)
        lines.update("++ " + os.path.normpath(os.path.join(here, f)) for f in files)
    return lines


def added(before, after):
    """New paths: entries of ``after`` that ``before`` lacks, untracked,
    ignored or on disk, caches left out. A tracked file changed during the
    run is not counted: that is someone editing while the tests run."""
    new = after - before
    return sorted(line for line in new if line[:3] in ("?? ", "!! ", "++ ") and not is_cache(line))


def is_cache(line):
    """A line (``XY PATH``) naming a cache folder, or a file in one."""
    return any(part in CACHES for part in line[3:].rstrip("/").split("/"))
