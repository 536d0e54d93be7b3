"""Read ``fairseq-generate`` output (``fairseq_cli/generate.py``).

Per sentence id, fairseq-generate prints (tab-separated)::

    S-<id>  source
    T-<id>  reference, post-processed and detokenised
    H-<id>  score  hypothesis (tokens, BPE/SentencePiece removed with --post-process)
    D-<id>  score  hypothesis, detokenised
    P-<id>  positional log-probabilities of the hypothesis tokens, base 2

and, with ``--nbest N``, N H/D/P lines per id, best first. Only the best
hypothesis is kept.
"""

import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from fairseq_natbias.analysis import AnalysisError

_LINE = re.compile(r"^(?P<kind>[STHDP])-(?P<id>\d+)\t(?P<rest>.*)$")


@dataclass
class GeneratedSentence:
    source: Optional[str] = None
    reference: Optional[str] = None
    hypothesis: Optional[str] = None  # H: tokens (post-processed)
    detokenized: Optional[str] = None  # D
    score: Optional[float] = None
    positional_scores_log2: List[float] = field(default_factory=list)


def parse_generate_output(lines) -> Dict[int, GeneratedSentence]:
    sentences: Dict[int, GeneratedSentence] = {}
    for line in lines:
        match = _LINE.match(line.rstrip("\n"))
        if match:
            entry = sentences.setdefault(int(match["id"]), GeneratedSentence())
            _fill(entry, match["kind"], match["rest"])
    return sentences


def _fill(entry: GeneratedSentence, kind: str, rest: str) -> None:
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


def read_text_lines(path: str, what: str) -> List[str]:
    """The lines of a UTF-8 text file; one that is not (e.g. a checkpoint
    given by mistake) is an AnalysisError asking for ``what``."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except UnicodeDecodeError as error:
        raise AnalysisError(f"{path} is not UTF-8 text (byte {error.start}); give {what}") from None


def read_generate_output(path: str) -> List[GeneratedSentence]:
    """The sentences of one fairseq-generate output file, ordered by id."""
    if not os.path.isfile(path):
        raise AnalysisError(f"{path}: no such fairseq-generate output")
    sentences = parse_generate_output(read_text_lines(path, "fairseq-generate's output"))
    hypotheses = [sentences[i] for i in sorted(sentences) if sentences[i].hypothesis is not None]
    if not hypotheses:
        raise AnalysisError(
            f"{path} holds no hypotheses (H-<id> lines): the test set is empty, or "
            "this is not fairseq-generate output"
        )
    return hypotheses
