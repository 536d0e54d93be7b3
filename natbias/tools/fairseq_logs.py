"""Read the metrics out of ``fairseq-train`` logs in fairseq's ``simple`` and
``json`` formats (``fairseq/logging/progress_bar.py``), with or without the
``DATE TIME | INFO | TAG |`` prefix of its console logging (``[DATE][TAG][INFO] -``
with fairseq-hydra-train)::

    epoch 001:     10 / 250 loss=9.1, ..., num_updates=10           (train_inner)
    epoch 001 | valid on 'valid' subset | loss 8.7 | ... | num_updates 250
    {"epoch": 1, "valid_loss": "8.7", ..., "valid_num_updates": "250"}

Keys are stored without the json format's subset prefix (``valid_bleu`` is
``bleu`` in a record tagged ``valid``).
"""

import contextlib
import json
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from natbias.errors import NaturalBiasError

TRAIN_INNER = "train_inner"
TRAIN = "train"
VALID = "valid"

_PREFIXES = (
    # fairseq-train: "2023-01-01 10:00:00 | INFO | valid | ..."
    re.compile(
        r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:,\d+)? \| [A-Z]+ \| "
        r"(?P<tag>\S+) \| (?P<message>.*)$"
    ),
    # fairseq-hydra-train: "[2023-01-01 10:00:00,123][valid][INFO] - ..."
    re.compile(
        r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:,\d+)?\]\[(?P<tag>[^\]]+)\]"
        r"\[[A-Z]+\] - (?P<message>.*)$"
    ),
)
_INNER = re.compile(r"^epoch (?P<epoch>\d+):\s+\d+ / \d+\s*(?P<stats>.*)$")
_INNER_STAT = re.compile(r"(\w+)=([^,\s]+)")
_SUBSET = re.compile(r"^(?:valid|test) on '(?P<subset>[^']+)' subset$")
_EPOCH = re.compile(r"^epoch (?P<epoch>\d+)$")


@dataclass
class LogRecord:
    """One metrics line: ``tag`` is ``train_inner``, ``train`` or a validation subset."""

    tag: str
    epoch: Optional[int]
    values: dict[str, float] = field(default_factory=dict)

    @property
    def num_updates(self) -> Optional[int]:
        value = self.values.get("num_updates")
        return None if value is None or not math.isfinite(value) else int(value)


def read_log(path: str) -> list[LogRecord]:
    """All metrics records of one ``fairseq-train`` log file, in file order."""
    if not os.path.isfile(path):
        raise NaturalBiasError(f"{path}: no such log file")
    with open(path, encoding="utf-8", errors="replace") as lines:
        return parse_lines(lines)


def parse_lines(lines: Iterable[str]) -> list[LogRecord]:
    records = (parse_line(line.rstrip("\n")) for line in lines)
    return [record for record in records if record is not None]


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
        return LogRecord(
            TRAIN_INNER, int(inner["epoch"]), _numbers(_INNER_STAT.findall(inner["stats"]))
        )
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
    pairs = [(k[len(prefix) :] if k.startswith(prefix) else k, v) for k, v in stats.items()]
    try:
        epoch = int(epoch)
    except (TypeError, ValueError):
        epoch = None
    return LogRecord(tag, epoch, _numbers(pairs))


def _json_tag(stats: dict) -> Optional[str]:
    """The tag of a json line without prefix: from ``<tag>_num_updates``, or
    ``train_inner`` for a line with a fractional ``update``."""
    for key in stats:
        if key.endswith("_num_updates"):
            return key[: -len("_num_updates")]
    return TRAIN_INNER if "update" in stats else None


def _parse_pipes(message: str, tag: Optional[str]) -> Optional[LogRecord]:
    epoch, subset, pairs = None, None, []
    for part in message.split(" | "):
        part = part.strip()
        if match := _EPOCH.match(part):
            epoch = int(match["epoch"])
        elif match := _SUBSET.match(part):
            subset = match["subset"]
        else:
            pairs.append(part.partition(" ")[::2])
    values = _numbers(pairs)
    if "num_updates" not in values:
        return None
    return LogRecord(tag or subset or TRAIN, epoch, values)


def _numbers(pairs) -> dict[str, float]:
    values = {}
    for key, value in pairs:
        with contextlib.suppress(TypeError, ValueError):
            values[key] = float(value)
    return values


def series(records: list[LogRecord], tag: str, key: str) -> tuple[np.ndarray, np.ndarray]:
    """``(updates, values)`` of ``key`` in the records tagged ``tag``, sorted by
    update; for an update logged twice (a resumed run) the last line wins."""
    by_update = {
        r.num_updates: r.values[key]
        for r in records
        if r.tag == tag and key in r.values and r.num_updates is not None
    }
    updates = np.array(sorted(by_update), dtype=np.float64)
    values = np.array([by_update[int(u)] for u in updates], dtype=np.float64)
    return updates, values


def available_keys(records: list[LogRecord], tag: str) -> list[str]:
    return sorted({key for record in records if record.tag == tag for key in record.values})


def split_metric(name: str) -> tuple[str, str]:
    """``valid_bleu`` -> (``valid``, ``bleu``); ``kl_unigram`` -> (``train_inner``, ``kl_unigram``)."""
    if name.startswith(VALID + "_"):
        return VALID, name[len(VALID) + 1 :]
    return TRAIN_INNER, name


def validation_series(records, path: str, key: str, subset: str = VALID):
    """The validation curve of ``key``, or a NaturalBiasError saying what the log holds instead."""
    updates, values = series(records, subset, key)
    if len(updates) == 0:
        present = available_keys(records, subset)
        if not present:
            raise NaturalBiasError(
                f"{path}: no validation lines (tag {subset!r}) in this log. "
                "fairseq writes them after each epoch or every "
                "--validate-interval-updates; was validation disabled, or is this "
                "not a fairseq-train log?"
            )
        raise NaturalBiasError(
            f"{path}: the {subset!r} lines have no {key!r} (they have: "
            f"{', '.join(k for k in present if k != 'num_updates')}). Validation "
            "BLEU needs fairseq-train --eval-bleu."
        )
    return updates, values
