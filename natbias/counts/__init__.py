"""Counting the target unigram: the tokens a model is trained to predict (the
paper, sec. 4.1: "unigram frequencies are computed on respective training sets
after tokenisation is performed"), from token ids, fairseq's binarised files
(read directly, so no fairseq is needed) or counts files (a bias estimated on
another corpus, App. A.7). Never from a vocabulary file's counts: with a
joined dictionary they add the source side, fairseq drops the EOS count from
``dict.txt``, and shipped vocabularies may carry dummy counts.
"""

import gzip
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Optional

import numpy as np

from natbias.counts.corpus import count_dataset as count_dataset
from natbias.counts.corpus import count_indexed as count_indexed
from natbias.counts.corpus import count_token_files as count_token_files
from natbias.counts.sources import CHUNK_TOKENS, IGNORE_INDEX, bincount, indexed_file, read_index
from natbias.errors import NaturalBiasError

COUNTS_FILE_HEADER = "#natbias-counts v1"
# A counts file keyed by id (``id<TAB>count``, ids 0..V-1 in order), for
# token files and datasets, which come with no symbols.
COUNTS_BY_ID_HEADER = COUNTS_FILE_HEADER + " by-id"


def count_ids(
    sequences: Iterable, vocab_size: int, ignore: Sequence[int] = (IGNORE_INDEX,)
) -> np.ndarray:
    """Counts (int64, one per id) of the ids in ``sequences``: an iterable of
    id sequences (lists, numpy arrays, torch tensors) or one array. Ids in
    ``ignore`` are skipped; any other id outside ``[0, vocab_size)`` is refused.
    Counted here, by this process alone: ids in memory are on every rank already."""
    kept = (c[~np.isin(c, ignore)] if len(ignore) else c for c in _chunks_of(sequences))
    return count_chunks(kept, vocab_size, "the token ids")


def count_chunks(chunks, vocab_size: int, where: str, pairs=None) -> np.ndarray:
    """Counts of the ids of all ``chunks`` in one process; ``pairs`` (a
    :class:`natbias.bigram.PairCounter`) counts each token's pair with the one
    before it in the same pass."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    if pairs is not None:
        pairs.start_stream()
    for chunk in chunks:
        counts += bincount(chunk, vocab_size, lambda i: where)
        if pairs is not None:
            pairs.add(chunk)
    return counts


def _chunks_of(sequences) -> Iterator[np.ndarray]:
    if hasattr(sequences, "shape"):  # one array or tensor
        yield _ids(sequences)
        return
    batch, size = [], 0
    for sequence in sequences:
        ids = _ids(sequence)
        batch.append(ids)
        size += ids.size
        if size >= CHUNK_TOKENS:
            yield np.concatenate(batch)
            batch, size = [], 0
    if batch:
        yield np.concatenate(batch)


def _ids(sequence) -> np.ndarray:
    """One sequence's ids, flat, as int64. Not np.asarray(..., int64), which
    truncates floats and fails on text with a traceback: anything but
    integers is refused, naming what it holds."""
    if hasattr(sequence, "numpy") and hasattr(sequence, "device"):  # a torch tensor
        sequence = sequence.detach().cpu().numpy()
    try:
        ids = np.asarray(sequence)
    except ValueError:  # numpy's "inhomogeneous shape": nested lists of unequal lengths
        raise NaturalBiasError(
            "a sequence holds lists of unequal lengths: pass one flat list of int ids per sequence"
        ) from None
    if ids.size and ids.dtype.kind not in "iu":
        first = ids.reshape(-1)[0]
        held = {"U": "text", "S": "text", "f": "floats"}.get(ids.dtype.kind, type(first).__name__)
        raise NaturalBiasError(
            f"token ids must be integers, but a sequence holds {held} (e.g. {str(first)[:40]!r}): "
            "pass one list of int ids per sequence, tokenising text first"
        )
    return ids.reshape(-1).astype(np.int64, copy=False)


# --- fairseq's binarised files ------------------------------------------------


def binarised_index(prefix: str):
    """Token dtype and the sentence lengths (memory-mapped int32) of
    ``PREFIX.idx``, fairseq's (or Megatron's) mmap index, read without fairseq."""
    dtype, lengths, _ = read_index(prefix)
    return np.dtype(dtype).type, lengths


def binarised_tokens(prefix: str) -> Iterator[np.ndarray]:
    """The tokens of ``PREFIX.bin`` in order, CHUNK_TOKENS at a time."""
    f = indexed_file(prefix)
    if f.length == 0:
        return
    tokens = np.memmap(f.path, dtype=f.dtype, mode="r", shape=(f.length,))
    for start in range(0, f.length, CHUNK_TOKENS):
        yield np.asarray(tokens[start : start + CHUNK_TOKENS])


def count_binarised(prefix: str, vocab_size: int, pairs=None) -> np.ndarray:
    """Token counts of one binarised split (``PREFIX.bin`` / ``PREFIX.idx``);
    with ``pairs`` (a :class:`natbias.bigram.PairCounter`) the same pass counts
    each token's pair with the one before it (one process, in order)."""
    if pairs is not None:
        return count_chunks(binarised_tokens(prefix), vocab_size, prefix + ".bin", pairs)
    return count_indexed([prefix], vocab_size, cache=False)


# --- text and counts files ----------------------------------------------------


def open_text(path):
    """A UTF-8 text file for reading, plain or gzipped (by its .gz name)."""
    return (gzip.open if str(path).endswith(".gz") else open)(path, "rt", encoding="utf-8")


def count_text(
    lines: Iterable[str], index_of: Callable[[str], int], eos: int, vocab_size: int, pairs=None
) -> np.ndarray:
    """Counts of space-separated tokenised text, one sentence a line, each
    ending in ``eos`` (as fairseq binarises it); ``index_of`` maps a piece to
    its id (the unknown id for pieces outside the vocabulary)."""
    ids = ([index_of(token) for token in line.split()] + [eos] for line in lines)
    return count_chunks(_chunks_of(ids), vocab_size, "the text", pairs)


def write_counts_file(path: str, symbols: Optional[Sequence[str]], counts: Sequence[int]) -> None:
    """One ``symbol<TAB>count`` line per vocabulary entry, in vocabulary order;
    without ``symbols``, one ``id<TAB>count`` line per id (a file by id)."""
    header = COUNTS_FILE_HEADER if symbols is not None else COUNTS_BY_ID_HEADER
    symbols = symbols if symbols is not None else [str(i) for i in range(len(counts))]
    if len(counts) != len(symbols):
        raise NaturalBiasError(f"{len(counts)} counts for a vocabulary of {len(symbols)}")
    with open(path, "w", encoding="utf-8") as out:
        out.write(header + "\n")
        out.writelines(f"{symbol}\t{int(count)}\n" for symbol, count in zip(symbols, counts))


def read_counts_by_symbol(path: str) -> dict[str, int]:
    """A counts file written by natbias-count, as ``{symbol: count}`` (a file
    by id: ``{"0": count, ...}``, marked by its header: see :func:`is_by_id`)."""
    if not os.path.isfile(path):
        raise NaturalBiasError(
            f"{path}: no such file; make a counts file with "
            "`natbias-count --dict DICT --text TOKENISED.txt --output PATH`"
        )
    by_symbol = {}
    # errors="replace": a binary file fails the header check, by name.
    with open(path, encoding="utf-8", errors="replace") as lines:
        if lines.readline().rstrip("\n") not in (COUNTS_FILE_HEADER, COUNTS_BY_ID_HEADER):
            raise NaturalBiasError(
                f"{path} does not start with {COUNTS_FILE_HEADER!r}: it is "
                "not a counts file written by natbias-count"
            )
        for number, line in enumerate(lines, start=2):
            symbol, tab, count = line.rstrip("\n").rpartition("\t")
            if not tab or not re.fullmatch(r"\d+", count):
                raise NaturalBiasError(
                    f"{path}:{number}: expected 'symbol<TAB>count', got {line!r}"
                )
            by_symbol[symbol] = int(count)
    return by_symbol


def is_by_id(path: str) -> bool:
    """Whether a counts file is keyed by id (natbias-count's --tokens, --hf-dataset)."""
    if not os.path.isfile(path):
        return False
    with open(path, encoding="utf-8", errors="replace") as lines:
        return lines.readline().rstrip("\n") == COUNTS_BY_ID_HEADER


def read_counts_file(path: str, symbols: Sequence[str], added: Sequence[str] = ()) -> np.ndarray:
    """Counts aligned to ``symbols`` (the vocabulary, in id order); a file
    made for another vocabulary is refused. ``added``: symbols a task adds to
    the dictionary it reads (language tokens), counted 0 where the file lacks them.
    A file by id holds one count per id: its ids are the vocabulary's."""
    by_symbol = read_counts_by_symbol(path)
    if is_by_id(path):
        symbols = [str(i) for i in range(len(symbols))]
        added = ()
    missing = [s for s in symbols if s not in by_symbol and s not in added]
    extra = sorted(set(by_symbol) - set(symbols))
    if missing or extra:
        raise NaturalBiasError(
            f"{path} does not match the vocabulary of {len(symbols)} entries: "
            f"{len(missing)} symbols missing (e.g. {missing[:3]}), {len(extra)} unknown "
            f"(e.g. {extra[:3]}); make the counts file with the model's own vocabulary"
        )
    counts = np.array([by_symbol.get(s, 0) for s in symbols], dtype=np.int64)
    if counts.sum() == 0:
        raise NaturalBiasError(f"{path} holds only zero counts")
    return counts


def check_counts(counts: Optional[np.ndarray], where: str) -> np.ndarray:
    """``counts`` as given: int64 where whole, float64 where fractional (a
    weighted mixture: used exactly, never truncated). Refused: what is not a
    count (NaN, infinite, negative, not a number), an empty corpus (nothing to
    estimate from) and fractions summing to at most 1 (probabilities, whose
    smoothed prior would be nearly uniform)."""
    values = np.asarray(counts)
    flat = values.reshape(-1)
    numeric = values.dtype.kind in "iuf"
    bad = np.flatnonzero(~np.isfinite(flat) | (flat < 0)) if numeric else [0]
    if len(bad):
        raise NaturalBiasError(
            f"{where} hold {flat[bad[0]]} at entry {bad[0]}, which is not a count: pass "
            "one finite count >= 0 per vocabulary entry"
        )
    if numeric and values.dtype.kind == "f" and np.any(flat != np.floor(flat)):
        if flat.sum() <= 1.0 + 1e-6:
            raise NaturalBiasError(
                f"{where} sum to {flat.sum():.6g}: they look like probabilities, which "
                "add-one smoothing would swamp; pass counts (how often each token occurs)"
            )
        return values.astype(np.float64)
    counts = values.astype(np.int64)
    if counts.sum() == 0:
        raise NaturalBiasError(
            f"{where} holds no tokens: there is nothing to estimate a unigram from"
        )
    return counts
