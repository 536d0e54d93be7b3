"""Read ``fairseq-generate`` output: per sentence id, tab-separated ``S-`` (source),
``T-`` (reference), ``H-`` (score, hypothesis), ``D-`` (score, detokenised) and
``P-`` (positional log2-probabilities) lines; with ``--nbest`` the best comes first
and is the one kept.
"""

import gzip
import re
from dataclasses import dataclass, field
from typing import Optional

from natbias.errors import NaturalBiasError

_LINE = re.compile(r"^(?P<kind>[STHDP])-(?P<id>\d+)\t(?P<rest>.*)$")


@dataclass
class GeneratedSentence:
    source: Optional[str] = None
    reference: Optional[str] = None
    hypothesis: Optional[str] = None  # H: tokens (post-processed)
    detokenized: Optional[str] = None  # D
    score: Optional[float] = None
    positional_scores_log2: list[float] = field(default_factory=list)


def parse_generate_output(lines) -> dict[int, GeneratedSentence]:
    sentences: dict[int, GeneratedSentence] = {}
    for line in lines:
        if not (match := _LINE.match(line.rstrip("\n"))):
            continue
        entry = sentences.setdefault(int(match["id"]), GeneratedSentence())
        kind, rest = match["kind"], match["rest"]
        if kind == "S":
            entry.source = rest
        elif kind == "T":
            entry.reference = rest
        elif kind == "H" and entry.hypothesis is None:
            score, _, text = rest.partition("\t")
            entry.score, entry.hypothesis = float(score), text
        elif kind == "D" and entry.detokenized is None:
            entry.detokenized = rest.partition("\t")[2]
        elif kind == "P" and not entry.positional_scores_log2:
            entry.positional_scores_log2 = [float(v) for v in rest.split()]
    return sentences


def read_text_lines(path: str, what: str) -> list[str]:
    """The lines of a UTF-8 text file, plain or gzipped (by its .gz name);
    anything else is a NaturalBiasError asking for ``what``."""
    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
            return f.read().splitlines()
    except UnicodeDecodeError as error:
        raise NaturalBiasError(
            f"{path} is not UTF-8 text (byte {error.start}); give {what}"
        ) from None
    except (gzip.BadGzipFile, EOFError) as error:
        raise NaturalBiasError(f"{path}: not a whole gzip file ({error}); give {what}") from None
