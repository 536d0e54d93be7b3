"""Where the tokens are, as shares that one process counts: the sources of
:mod:`natbias.counts.corpus`. Each source says how to split itself across
ranks (``shares(rank, world)``), how many tokens a share holds (for the
progress bar) and what identifies its data (for the cache's key).

Every share is counted the same way, one chunk of at most ``CHUNK_TOKENS``
tokens at a time: ``np.bincount`` straight on the chunk as stored (numpy
widens it to int64 inside, once), which also finds every bad id for free: a
negative id raises, one at or above the vocabulary lengthens the result.
Only then, on that error path, is the offending id looked for and named.
"""

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np

from natbias.errors import NaturalBiasError

# Tokens read per step: the extra memory is one chunk widened to int64 (32 MiB).
CHUNK_TOKENS = 1 << 22
IGNORE_INDEX = -100  # PyTorch's and transformers' label for "no target here"
TOKEN_DTYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64")


def bincount(ids: np.ndarray, vocab_size: int, where) -> np.ndarray:
    """Counts of ``ids`` (one per vocabulary id); an id outside the
    vocabulary is refused, naming ``where(position)`` it is."""
    try:
        counts = np.bincount(ids, minlength=vocab_size) if ids.size else None
    except ValueError:  # a negative id
        counts = None
    if counts is None:
        if not ids.size:
            return np.zeros(vocab_size, dtype=np.int64)
        position = int(np.argmax(ids < 0))
    elif counts.size == vocab_size:
        return counts
    else:
        position = int(np.argmax(ids >= vocab_size))
    raise NaturalBiasError(
        f"{where(position)} holds token id {int(ids[position])}, outside the vocabulary of "
        f"{vocab_size} entries: count with the vocabulary the model is trained with"
    )


def _without_ignored(ids: np.ndarray, ignore: Sequence[int]) -> np.ndarray:
    """``ids`` less the ``ignore`` ids (-100); only signed ids can hold them."""
    if not len(ignore) or ids.dtype.kind != "i" or not ids.size or ids.min() >= 0:
        return ids
    return ids[~np.isin(ids, ignore)]


# --- token files --------------------------------------------------------------


@dataclass(frozen=True)
class TokenFile:
    """A flat file of token ids (numpy's ``tofile``, OLMo-core's ``.npy`` token
    files, nanoGPT's ``train.bin``, the ``.bin`` of fairseq's and Megatron's
    indexed datasets): ``length`` tokens of ``dtype`` from byte ``offset``.
    ``instance`` (OLMo-core's fixed-length instances): the first token of
    each ``instance`` tokens is no target, and only whole instances count."""

    path: str
    dtype: str
    length: int
    instance: Optional[int] = None
    offset: int = 0

    def key(self) -> list:
        stat = os.stat(self.path)
        return [os.path.abspath(self.path), stat.st_size, stat.st_mtime_ns, self.dtype,
                self.length, self.instance, self.offset]  # fmt: skip


def token_file(path, dtype, instance: Optional[int] = None, length=None) -> TokenFile:
    """A :class:`TokenFile` for the whole of ``path`` (or its first
    ``length`` tokens), checked: its size a multiple of the dtype's."""
    path, dtype = os.fspath(path), np.dtype(dtype)
    if dtype.kind not in "iu":
        raise NaturalBiasError(f"{path}: token files hold integers, not {dtype}: give its dtype")
    try:
        size = os.path.getsize(path)
    except OSError as error:
        raise NaturalBiasError(f"{path}: {error.strerror}") from None
    if size % dtype.itemsize:
        raise NaturalBiasError(
            f"{path} holds {size} bytes, not a whole number of {dtype} ids: give the "
            "dtype the file was written with"
        )
    tokens = size // dtype.itemsize if length is None else min(length, size // dtype.itemsize)
    if instance:
        tokens -= tokens % instance
    return TokenFile(path, dtype.name, tokens, instance)


class TokenFiles:
    """Token files counted as one stream of ``sum(length)`` tokens, split
    across ranks into equal ranges of it (each at a whole instance), so that
    any number of ranks shares any number of files evenly."""

    def __init__(self, files: Sequence[TokenFile]):
        self.files = list(files)

    def key(self) -> list:
        return ["token files", [f.key() for f in self.files]]

    def shares(self, rank: int, world: int) -> list:
        """The ``(file, start, stop)`` ranges of this rank's slice of the stream."""
        total, ranges, at = sum(f.length for f in self.files), [], 0
        low, high = total * rank // world, total * (rank + 1) // world
        for f in self.files:
            unit = f.instance or 1
            start, stop = max(low - at, 0), min(high - at, f.length)
            start, stop = -(-start // unit) * unit, -(-stop // unit) * unit  # whole instances
            if stop > start:
                ranges.append((f, start, min(stop, f.length)))
            at += f.length
        return ranges

    @staticmethod
    def total(shares) -> int:
        return sum(stop - start for _, start, stop in shares)

    @staticmethod
    def count(share, vocab_size: int, progress) -> np.ndarray:
        f, start, stop = share
        counts = np.zeros(vocab_size, dtype=np.int64)
        if stop <= start:
            return counts
        step = CHUNK_TOKENS - CHUNK_TOKENS % f.instance if f.instance else CHUNK_TOKENS
        itemsize = np.dtype(f.dtype).itemsize
        for first in range(start, stop, step):
            # Each chunk mapped on its own and unmapped after: a mapping of the
            # whole file would keep every page read resident in this process.
            offset, size = f.offset + first * itemsize, min(step, stop - first)
            chunk = np.memmap(f.path, dtype=f.dtype, mode="r", offset=offset, shape=(size,))
            counts += bincount(chunk, vocab_size, lambda i, s=first: f"{f.path} at token {s + i}")
            if f.instance:  # an instance's first token is what the model reads first
                counts -= np.bincount(chunk[:: f.instance], minlength=vocab_size)
            progress(chunk.size)
        return counts


# --- indexed datasets: fairseq's and Megatron's .bin / .idx -------------------

# Both write "MMIDIDX\0\0", a uint64 version (1), a uint8 dtype code and a
# uint64 sequence count; Megatron then a uint64 document count. Then int32
# lengths and int64 pointers (and Megatron's int64 document indices).
INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 8: "uint16",
                9: "uint32", 10: "uint64"}  # fmt: skip


def read_index(prefix: str):
    """Token dtype, the sequence lengths (memory-mapped int32) and the
    layout (``"fairseq"`` or ``"megatron"``) of ``PREFIX.idx``."""
    path = prefix + ".idx"
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as stream:
            header = stream.read(len(INDEX_MAGIC) + 25)
    except OSError as error:
        raise NaturalBiasError(
            f"{path}: {error.strerror}; binarise the data with fairseq-preprocess "
            "(or Megatron's preprocess_data.py)"
        ) from None
    if not header.startswith(INDEX_MAGIC) or len(header) < len(INDEX_MAGIC) + 17:
        raise NaturalBiasError(
            f"{path} is not an mmap index: binarise with fairseq-preprocess "
            "--dataset-impl mmap (its default) or Megatron's preprocess_data.py"
        )
    start = len(INDEX_MAGIC)
    version = int.from_bytes(header[start : start + 8], "little")
    code, sequences = header[start + 8], int.from_bytes(header[start + 9 : start + 17], "little")
    if version != 1 or code not in INDEX_DTYPES:
        raise NaturalBiasError(f"{path}: unknown index version {version} or dtype code {code}")
    fairseq_end = start + 17
    documents = int.from_bytes(header[fairseq_end : fairseq_end + 8], "little")
    if size == fairseq_end + 12 * sequences:
        layout, lengths_at = "fairseq", fairseq_end
    elif size == fairseq_end + 8 + 12 * sequences + 8 * documents:
        layout, lengths_at = "megatron", fairseq_end + 8
    else:
        raise NaturalBiasError(f"{path} is truncated or not an index: re-binarise the data")
    if sequences == 0:
        return INDEX_DTYPES[code], np.zeros(0, dtype=np.int32), layout
    lengths = np.memmap(path, dtype=np.int32, mode="r", offset=lengths_at, shape=(sequences,))
    return INDEX_DTYPES[code], lengths, layout


def indexed_file(prefix: str) -> TokenFile:
    """The ``PREFIX.bin`` of an indexed dataset, as one token file: every
    token of every sequence is a target there (fairseq appends EOS to each)."""
    dtype, lengths, _ = read_index(prefix)
    total = int(lengths.sum(dtype=np.int64))
    path = prefix + ".bin"
    if not os.path.isfile(path) or os.path.getsize(path) < total * np.dtype(dtype).itemsize:
        raise NaturalBiasError(
            f"{path} is missing or shorter than {prefix}.idx says: re-binarise the data"
        )
    return TokenFile(path, dtype, total)


# --- 🤗 datasets, through their Arrow columns ---------------------------------


class ArrowDataset:
    """A map-style 🤗 ``datasets.Dataset``'s list column, read as Arrow
    arrays (never Python lists), split across ranks by rows. ``causal``: the
    first token of each row is no target; ids in ``ignore`` (-100) are skipped."""

    ROWS = 1 << 14  # rows a step: a few MiB of tokens for sequences of hundreds

    def __init__(self, dataset, column: str, causal: bool, ignore=(IGNORE_INDEX,)):
        self.dataset = dataset.with_format("arrow")
        self.column, self.causal, self.ignore = column, causal, tuple(ignore)

    def key(self) -> list:
        files = [f["filename"] for f in self.dataset.cache_files]
        stats = [[os.path.abspath(p), os.path.getsize(p), os.stat(p).st_mtime_ns] for p in files]
        return ["arrow", self.dataset._fingerprint, stats, self.column, self.causal, self.ignore]

    def shares(self, rank: int, world: int) -> list:
        rows = len(self.dataset)
        low, high = rows * rank // world, rows * (rank + 1) // world
        return [(start, min(start + self.ROWS, high)) for start in range(low, high, self.ROWS)]

    def total(self, shares):
        """The tokens of these rows, from the offsets alone (no ids read);
        None where the dataset reads its rows through an indices mapping."""
        if not shares or self.dataset._indices is not None:
            return None
        start, stop = shares[0][0], shares[-1][1]
        column = self.dataset.data.table.slice(start, stop - start).column(self.column)
        return sum(span(c) for c in column.chunks)

    def count(self, share, vocab_size: int, progress) -> np.ndarray:
        start, stop = share
        column = self.dataset[start:stop].column(self.column)
        counts = np.zeros(vocab_size, dtype=np.int64)
        for array in column.chunks:
            counts += count_list_array(array, vocab_size, self.causal, self.ignore, start)
            progress(span(array))
        return counts


def count_list_array(array, vocab_size: int, causal: bool, ignore, first_row: int = 0):
    """Counts of a pyarrow list array of token ids (one list per row)."""
    import pyarrow as pa

    if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
        raise NaturalBiasError(
            f"the target column holds {array.type}, not lists of token ids: tokenise it first"
        )
    if not pa.types.is_integer(array.type.value_type):
        raise NaturalBiasError(
            f"the target column holds lists of {array.type.value_type}, not token ids: "
            "tokenise it first, one flat list of int ids per row"
        )
    offsets = array.offsets.to_numpy()
    ids = array.values.slice(offsets[0], offsets[-1] - offsets[0]).to_numpy(zero_copy_only=False)
    offsets = offsets - offsets[0]

    def where(_):
        bad = (ids < 0) & ~np.isin(ids, ignore) | (ids >= vocab_size)
        row = np.searchsorted(offsets, np.argmax(bad), side="right") - 1
        return f"the dataset's row {first_row + int(row)}"

    counts = bincount(_without_ignored(ids, ignore), vocab_size, where)
    if causal:  # each row's first token is read, never predicted
        firsts = ids[offsets[:-1][np.diff(offsets) > 0]]
        counts -= np.bincount(_without_ignored(firsts, ignore), minlength=vocab_size)
    return counts


def span(array) -> int:
    """The tokens of a pyarrow list array, from its offsets."""
    return int(array.offsets[-1].as_py() - array.offsets[0].as_py()) if len(array) else 0


class StreamingDataset:
    """A 🤗 ``IterableDataset`` (a local streaming one), read a batch of Arrow
    rows at a time; split across ranks by ``datasets.distributed.split_dataset_by_node``."""

    def __init__(self, dataset, column: str, causal: bool, ignore=(IGNORE_INDEX,)):
        self.dataset, self.column, self.causal, self.ignore = dataset, column, causal, tuple(ignore)

    def key(self):
        return None  # a stream has no fingerprint of its files: never cached

    def shares(self, rank: int, world: int) -> list:
        if world == 1:
            return [self.dataset]
        from datasets.distributed import split_dataset_by_node

        return [split_dataset_by_node(self.dataset, rank=rank, world_size=world)]

    @staticmethod
    def total(shares):
        return None

    def count(self, share, vocab_size: int, progress) -> np.ndarray:
        counts = np.zeros(vocab_size, dtype=np.int64)
        rows = 0
        for table in share.with_format("arrow").iter(batch_size=ArrowDataset.ROWS):
            for array in table.column(self.column).chunks:
                counts += count_list_array(array, vocab_size, self.causal, self.ignore, rows)
                progress(span(array))
            rows += table.num_rows
        return counts
