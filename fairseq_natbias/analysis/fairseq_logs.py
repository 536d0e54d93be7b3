"""Read the metrics out of ``fairseq-train`` logs, in fairseq's ``simple`` and
``json`` log formats (``--log-format``).

What fairseq writes (``fairseq/logging/progress_bar.py``), after the
``DATE TIME | INFO | TAG |`` prefix of its console logging (``[DATE TIME][TAG][INFO] -``
with fairseq-hydra-train; no prefix in a ``--log-file``, where the tag is read
off the message)::

    simple, every --log-interval updates (tag train_inner)
        epoch 001:     10 / 250 loss=9.1, nll_loss=8.9, ..., num_updates=10, lr=...
    simple, end of epoch (tag train) and each validation (tag: the subset, e.g. valid)
        epoch 001 | loss 9.0 | ... | num_updates 250
        epoch 001 | valid on 'valid' subset | loss 8.7 | ... | bleu 1.2 | num_updates 250
    json (same tags)
        {"epoch": 1, "update": 0.04, "loss": "9.1", ..., "num_updates": "10"}
        {"epoch": 1, "valid_loss": "8.7", ..., "valid_bleu": "1.2", "valid_num_updates": "250"}

``--log-format tqdm`` (an interactive terminal) writes epoch and validation
lines as ``simple`` does, and no ``train_inner`` lines.

Keys are stored without the subset prefix of the json format (``valid_bleu``
becomes ``bleu`` in a record tagged ``valid``). A resumed run appended to the
same log repeats some update numbers; :func:`series` keeps the last value
logged for each update, the one the resumed run computed.
"""

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from fairseq_natbias.analysis import AnalysisError

TRAIN_INNER = "train_inner"
TRAIN = "train"
VALID = "valid"

_PREFIXES = (
    # fairseq-train: "2023-01-01 10:00:00 | INFO | valid | ..."
    re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:,\d+)? \| [A-Z]+ \| "
               r"(?P<tag>\S+) \| (?P<message>.*)$"),
    # fairseq-hydra-train: "[2023-01-01 10:00:00,123][valid][INFO] - ..."
    re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:,\d+)?\]\[(?P<tag>[^\]]+)\]"
               r"\[[A-Z]+\] - (?P<message>.*)$"),
)
_INNER = re.compile(r"^epoch (?P<epoch>\d+):\s+\d+ / \d+\s*(?P<stats>.*)$")
_INNER_STAT = re.compile(r"(\w+)=([^,\s]+)")
_SUBSET = re.compile(r"^(?:valid|test) on '(?P<subset>[^']+)' subset$")
_EPOCH = re.compile(r"^epoch (?P<epoch>\d+)$")


@dataclass
class LogRecord:
    """One metrics line: ``tag`` is ``train_inner``, ``train`` or the name of
    a validation subset (``valid``)."""

    tag: str
    epoch: Optional[int]
    values: Dict[str, float] = field(default_factory=dict)

    @property
    def num_updates(self) -> Optional[int]:
        value = self.values.get("num_updates")
        return None if value is None or not math.isfinite(value) else int(value)


def read_log(path: str) -> List[LogRecord]:
    """All metrics records of one ``fairseq-train`` log file, in file order."""
    if not os.path.isfile(path):
        raise AnalysisError(f"{path}: no such log file")
    with open(path, encoding="utf-8", errors="replace") as lines:
        return parse_lines(lines)


def parse_lines(lines: Iterable[str]) -> List[LogRecord]:
    records = []
    for line in lines:
        record = parse_line(line.rstrip("\n"))
        if record is not None:
            records.append(record)
    return records


def parse_line(line: str) -> Optional[LogRecord]:
    """The metrics record of one log line, or None for any other line."""
    prefixed = next((m for m in (p.match(line) for p in _PREFIXES) if m), None)
    tag, message = (prefixed["tag"], prefixed["message"]) if prefixed else (None, line)
    if tag is not None and "." in tag:
        return None  # a module logger (fairseq_cli.train, ...), not a metrics line
    message = message.strip()
    if message.startswith("{"):
        return _parse_json(message, tag)
    inner = _INNER.match(message)
    if inner:
        if tag not in (None, TRAIN_INNER):
            return None
        return LogRecord(TRAIN_INNER, int(inner["epoch"]),
                         _numbers(_INNER_STAT.findall(inner["stats"])))
    if " | " in message:
        return _parse_pipes(message, tag)
    return None


def _parse_json(message: str, tag: Optional[str]) -> Optional[LogRecord]:
    try:
        stats = json.loads(message)
    except ValueError:
        return None
    if not isinstance(stats, dict):
        return None
    epoch = stats.pop("epoch", None)
    tag = tag or _json_tag(stats)
    if tag is None:
        return None
    prefix = tag + "_"
    pairs = [(k[len(prefix):] if k.startswith(prefix) else k, v) for k, v in stats.items()]
    return LogRecord(tag, _int_or_none(epoch), _numbers(pairs))


def _json_tag(stats: dict) -> Optional[str]:
    """The tag of a json line from a ``--log-file`` (no prefix): end-of-epoch
    and validation keys carry it (``valid_num_updates``); train_inner lines
    carry a fractional ``update`` instead."""
    for key in stats:
        if key.endswith("_num_updates"):
            return key[: -len("_num_updates")]
    return TRAIN_INNER if "update" in stats else None


def _parse_pipes(message: str, tag: Optional[str]) -> Optional[LogRecord]:
    parts = message.split(" | ")
    epoch, subset, pairs = None, None, []
    for part in parts:
        part = part.strip()
        if _EPOCH.match(part):
            epoch = int(_EPOCH.match(part)["epoch"])
        elif _SUBSET.match(part):
            subset = _SUBSET.match(part)["subset"]
        else:
            key, _, value = part.partition(" ")
            pairs.append((key, value))
    values = _numbers(pairs)
    if "num_updates" not in values:
        return None
    return LogRecord(tag or subset or TRAIN, epoch, values)


def _numbers(pairs) -> Dict[str, float]:
    values = {}
    for key, value in pairs:
        try:
            values[key] = float(value)
        except (TypeError, ValueError):
            continue
    return values


def _int_or_none(value) -> Optional[int]:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


# --- series over updates ------------------------------------------------------


def series(records: List[LogRecord], tag: str, key: str) -> Tuple[np.ndarray, np.ndarray]:
    """``(updates, values)`` of ``key`` in the records tagged ``tag``, sorted
    by update; for an update logged twice (a resumed run) the last line wins."""
    by_update = {}
    for record in records:
        if record.tag != tag or key not in record.values or record.num_updates is None:
            continue
        by_update[record.num_updates] = record.values[key]
    updates = np.array(sorted(by_update), dtype=np.float64)
    values = np.array([by_update[int(u)] for u in updates], dtype=np.float64)
    return updates, values


def available_keys(records: List[LogRecord], tag: str) -> List[str]:
    keys = set()
    for record in records:
        if record.tag == tag:
            keys.update(record.values)
    return sorted(keys)


def split_metric(name: str) -> Tuple[str, str]:
    """``valid_bleu`` -> (``valid``, ``bleu``); ``kl_unigram`` -> (``train_inner``,
    ``kl_unigram``): a ``valid_`` prefix selects the validation lines."""
    if name.startswith(VALID + "_"):
        return VALID, name[len(VALID) + 1:]
    return TRAIN_INNER, name


def validation_series(records, path: str, key: str, subset: str = VALID):
    """The validation learning curve of ``key``, or an AnalysisError that says
    what the log holds instead."""
    updates, values = series(records, subset, key)
    if len(updates) == 0:
        present = available_keys(records, subset)
        if not present:
            raise AnalysisError(
                f"{path}: no validation lines (tag {subset!r}) in this log. "
                "fairseq writes them after each epoch or every "
                "--validate-interval-updates; was validation disabled, or is this "
                "not a fairseq-train log?"
            )
        raise AnalysisError(
            f"{path}: the {subset!r} lines have no {key!r} (they have: "
            f"{', '.join(k for k in present if k != 'num_updates')}). Validation "
            "BLEU needs fairseq-train --eval-bleu."
        )
    return updates, values
