"""Lexical diversity of generated text (Kobayashi et al., 2023, eqs. 5 and 6)::

    D_n(texts) := # unique n-grams in texts / # n-grams in texts      (5)
    D(texts)   := 1/4 sum_{n=1}^{4} D_n(texts)                        (6)

counted over the whole set of texts, n-grams never crossing a text boundary;
words split by sacreBLEU's ``13a`` tokenizer (``none``: at spaces). A D_n
without any n-gram is nan, and so is D.
"""

import functools
import math
from collections import Counter
from collections.abc import Sequence

from natbias.errors import NaturalBiasError

MAX_N = 4
TOKENIZERS = ("13a", "none")


@functools.cache
def _tokenizer_13a():
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    return Tokenizer13a()


def tokenize(text: str, tokenizer: str = "13a") -> list[str]:
    if tokenizer == "13a":
        text = _tokenizer_13a()(text)
    elif tokenizer != "none":
        raise NaturalBiasError(f"unknown tokenizer {tokenizer!r}: choose {' or '.join(TOKENIZERS)}")
    return text.split()


def distinct_n(token_lists: Sequence[Sequence[str]], n: int) -> float:
    """D_n, eq. (5)."""
    counts = Counter()
    for tokens in token_lists:
        counts.update(zip(*(tokens[i:] for i in range(n))))
    total = sum(counts.values())
    return len(counts) / total if total else math.nan


def diversity(token_lists: Sequence[Sequence[str]], max_n: int = MAX_N) -> dict[str, float]:
    """``{"D1": ..., ..., "D4": ..., "D": mean}`` (eqs. 5 and 6)."""
    scores = {f"D{n}": distinct_n(token_lists, n) for n in range(1, max_n + 1)}
    scores["D"] = sum(scores.values()) / max_n
    return scores


def text_diversity(
    texts: Sequence[str], tokenizer: str = "13a", max_n: int = MAX_N
) -> dict[str, float]:
    if not texts:
        raise NaturalBiasError("no texts to measure the diversity of")
    return diversity([tokenize(text, tokenizer) for text in texts], max_n)
