"""The run grid that ``natbias-report`` and ``natbias-dynamics`` read::

    RUNS/<dataset>/<init>/seed<k>/train.log         fairseq-train's output (--eval-bleu)
                                 /test.bleu.json    sacrebleu REF -i HYP -m bleu
                                 /test.chrf.json    sacrebleu REF -i HYP -m chrf

``<k>`` as in ``seed1``, ``seed_2``, ``seed-3``. Without the dataset level
(``RUNS/<init>/seed<k>/``, as the recipes write) the dataset is named after
``RUNS``, or by ``NAME=RUNS``. A score file holds sacreBLEU's JSON, the bare
number (``sacrebleu -b``), or, as ``test.json``, the list of ``-m bleu chrf``.
"""

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from natbias.errors import NaturalBiasError

LOG_NAME = "train.log"
SCORE_FILES = {"bleu": "test.bleu.json", "chrf": "test.chrf.json"}
SEED_DIR = re.compile(r"^seed[-_]?(?P<seed>\d+)$")
INIT_ORDER = ("none", "zero", "unigram", "file")


@dataclass
class Run:
    dataset: str
    init: str
    seed: int
    path: str
    log_file: Optional[str] = None  # a log given by itself rather than as RUN/train.log

    @property
    def log(self) -> str:
        return self.log_file or os.path.join(self.path, LOG_NAME)


@dataclass
class Score:
    value: float
    signature: Optional[str]


def discover_runs(roots: Sequence[str]) -> list[Run]:
    """Every ``seed<k>`` directory under the roots (``RUNS`` or ``NAME=RUNS``)."""
    runs = []
    for spec in roots:
        name, sep, root = spec.partition("=")
        if not sep:
            name, root = None, spec
        if not os.path.isdir(root):
            raise NaturalBiasError(f"{root}: no such directory")
        runs.extend(_runs_under(root, name))
    if not runs:
        raise NaturalBiasError(
            f"no run directories under {', '.join(roots)}: expected "
            "RUNS/<dataset>/<init>/seed<k>/ holding train.log and test.bleu.json "
            "(see `natbias-report --help`)"
        )
    return sorted(runs, key=lambda r: (r.dataset, init_rank(r.init), r.seed))


def _runs_under(root, name=None):
    root_name = name or os.path.basename(os.path.abspath(root))
    for directory, subdirs, _files in os.walk(root):
        subdirs.sort()
        match = SEED_DIR.match(os.path.basename(directory))
        if not match:
            continue
        init_dir = os.path.dirname(directory)
        dataset_dir = os.path.relpath(os.path.dirname(init_dir), root)
        if dataset_dir.startswith(".."):
            continue  # the root itself is a seed or init directory
        dataset = (
            root_name if dataset_dir == "." else f"{name}/{dataset_dir}" if name else dataset_dir
        )
        yield Run(dataset, os.path.basename(init_dir), int(match["seed"]), directory)


def init_rank(init: str):
    return (INIT_ORDER.index(init) if init in INIT_ORDER else len(INIT_ORDER), init)


def read_test_score(run_dir: str, metric: str, eval_set: str = "test") -> Optional[Score]:
    """The ``metric`` (``bleu`` or ``chrf``) of one run on ``eval_set``, None if absent."""
    path = os.path.join(run_dir, f"{eval_set}.{metric}.json")
    if os.path.isfile(path):
        return _score_from_json(_load_json(path), metric, path)
    combined = os.path.join(run_dir, f"{eval_set}.json")
    if os.path.isfile(combined):
        entries = _load_json(combined)
        if isinstance(entries, dict):
            entries = [entries]
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict) and _metric_of(entry.get("name", "")) == metric:
                return _score_from_json(entry, metric, combined)
    return None


def _load_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as error:
        raise NaturalBiasError(
            f"{path} is neither sacreBLEU's JSON output nor a bare score ({error})"
        ) from None


def _score_from_json(data, metric, path) -> Score:
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return Score(float(data), None)
    if isinstance(data, list):
        matching = [
            e for e in data if isinstance(e, dict) and _metric_of(e.get("name", "")) == metric
        ]
        if len(matching) != 1:
            raise NaturalBiasError(f"{path}: expected one {metric} entry, found {len(matching)}")
        data = matching[0]
    if isinstance(data, dict) and isinstance(data.get("score"), (int, float)):
        name = data.get("name")
        if name is not None and _metric_of(name) != metric:
            raise NaturalBiasError(f"{path} holds a {name} score where {metric} was expected")
        return Score(float(data["score"]), data.get("signature"))
    raise NaturalBiasError(f"{path}: no score in it (expected sacreBLEU's JSON output)")


def _metric_of(name: str) -> Optional[str]:
    lowered = name.lower()
    return "bleu" if lowered == "bleu" else "chrf" if lowered.startswith("chrf") else None
