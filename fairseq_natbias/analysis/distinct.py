"""Lexical diversity of generated text: distinct-n and n-gram diversity D.

Kobayashi et al. (2023), sec. 3.3, eqs. (5) and (6), after Li et al. (2016) and
Meister et al. (2022)::

    D_n(texts) := # unique n-grams in texts / # n-grams in texts      (5)
    D(texts)   := 1/4 sum_{n=1}^{4} D_n(texts)                        (6)

Counts run over the whole set of texts (a corpus-level ratio); n-grams never
cross a text boundary. Texts are split into words with sacreBLEU's ``13a``
tokenizer (Kobayashi et al. used NLTK's word tokenizer, which this package does
not depend on; ``--tokenize none`` splits at spaces only). A D_n with no n-gram
at all (every text shorter than n) is undefined (nan), and so is D.
"""

import functools
import math
from collections import Counter
from typing import Dict, List, Sequence

from fairseq_natbias.analysis import AnalysisError

MAX_N = 4
TOKENIZERS = ("13a", "none")


@functools.lru_cache(maxsize=None)
def _tokenizer_13a():
    """One sacreBLEU 13a tokenizer for every text (it is stateless)."""
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    return Tokenizer13a()


def tokenize(text: str, tokenizer: str = "13a") -> List[str]:
    if tokenizer == "13a":
        text = _tokenizer_13a()(text)
    elif tokenizer != "none":
        raise AnalysisError(f"unknown tokenizer {tokenizer!r}: choose {' or '.join(TOKENIZERS)}")
    return text.split()


def ngrams(tokens: Sequence[str], n: int):
    return zip(*(tokens[i:] for i in range(n)))


def distinct_n(token_lists: Sequence[Sequence[str]], n: int) -> float:
    """D_n, eq. (5): unique n-grams over all n-grams of all texts."""
    counts = Counter()
    for tokens in token_lists:
        counts.update(ngrams(tokens, n))
    total = sum(counts.values())
    return len(counts) / total if total else math.nan


def diversity(token_lists: Sequence[Sequence[str]], max_n: int = MAX_N) -> Dict[str, float]:
    """``{"D1": ..., ..., "D4": ..., "D": mean}`` (eqs. 5 and 6)."""
    scores = {f"D{n}": distinct_n(token_lists, n) for n in range(1, max_n + 1)}
    scores["D"] = sum(scores.values()) / max_n
    return scores


def text_diversity(texts: Sequence[str], tokenizer: str = "13a",
                   max_n: int = MAX_N) -> Dict[str, float]:
    if not texts:
        raise AnalysisError("no texts to measure the diversity of")
    return diversity([tokenize(text, tokenizer) for text in texts], max_n)
