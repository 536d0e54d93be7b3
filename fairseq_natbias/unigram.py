"""Target-side unigram statistics: the one counter the model, the criterion and
the tools share.

The paper (Meister et al., 2023, sec. 4.1): "unigram frequencies are computed
on respective training sets after tokenisation is performed". Here that means
the binarised target split(s) fairseq trains on, EOS included (fairseq appends
one EOS to every sentence), never the ``dict.txt`` counts: with
``--joined-dictionary`` those add the source side, the saved dictionary drops
the EOS count, and shipped vocabularies may carry dummy counts.

Smoothing is add-alpha (Laplace for alpha = 1)::

    p(v) = (c(v) + alpha) / (N + alpha * |V|)

so every entry of ``log p`` is finite, including ``<pad>`` and ``<s>``, which
never occur as targets.
"""

import logging
import math
import os
import re
import struct
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import torch

logger = logging.getLogger(__name__)

# Tokens read per step when counting: bounds the extra memory at one chunk
# as int64 (16 MiB) above the counts themselves.
COUNT_CHUNK_TOKENS = 1 << 21

COUNTS_FILE_HEADER = "#natbias-counts v1"


class UnigramError(ValueError):
    """Bad input to the unigram statistics; the message names the fix."""


@dataclass
class TargetSplit:
    """One binarised target-side file prefix, e.g. ``data/train.de-en.en``."""

    prefix: str
    impl: str


def find_target_splits(
    data: str, split: str, source_lang: str, target_lang: str
) -> List[TargetSplit]:
    """All target-side files fairseq's translation task trains on for ``split``.

    ``data`` may hold several shards separated by ``:`` (fairseq cycles through
    them by epoch); each shard may hold ``train``, ``train1``, ``train2``, ...
    (fairseq concatenates them). All of them count.
    """
    from fairseq.data import indexed_dataset

    found = []
    for shard in [p for p in data.split(":") if p]:
        k = 0
        while True:
            split_k = split + (str(k) if k > 0 else "")
            prefix = _existing_prefix(shard, split_k, source_lang, target_lang)
            if prefix is None:
                break
            impl = indexed_dataset.infer_dataset_impl(prefix)
            found.append(TargetSplit(prefix=prefix, impl=impl))
            k += 1
    return found


def _existing_prefix(shard, split, src, tgt) -> Optional[str]:
    from fairseq.data import indexed_dataset

    for pair in (f"{src}-{tgt}", f"{tgt}-{src}"):
        prefix = os.path.join(shard, f"{split}.{pair}.{tgt}")
        if indexed_dataset.infer_dataset_impl(prefix) is not None:
            return prefix
    return None


def count_binarized(prefix: str, vocab_size: int, impl: str = "mmap") -> np.ndarray:
    """Token counts of one binarised split, as int64 of length ``vocab_size``.

    The mmap format stores all sentences back to back in ``prefix.bin`` with
    the dtype named in ``prefix.idx``, so a chunked ``np.bincount`` over the
    memory-mapped file counts every token once without touching Python per
    sentence.
    """
    if impl == "mmap":
        return _count_mmap(prefix, vocab_size)
    return _count_generic(prefix, vocab_size, impl)


def _count_mmap(prefix, vocab_size):
    from fairseq.data import indexed_dataset

    dtype, total = _read_mmap_index(indexed_dataset.index_file_path(prefix))
    itemsize = np.dtype(dtype).itemsize
    data_path = indexed_dataset.data_file_path(prefix)
    if os.path.getsize(data_path) < total * itemsize:
        raise UnigramError(
            f"{data_path} is shorter than its index {prefix}.idx says; the "
            "binarised split is truncated. Re-run fairseq-preprocess."
        )
    counts = np.zeros(vocab_size, dtype=np.int64)
    if total == 0:
        return counts
    tokens = np.memmap(data_path, dtype=dtype, mode="r", shape=(total,))
    for start in range(0, total, COUNT_CHUNK_TOKENS):
        chunk = np.asarray(tokens[start : start + COUNT_CHUNK_TOKENS])
        counts += _bincount_checked(chunk, vocab_size, prefix)
    del tokens
    return counts


def _read_mmap_index(path):
    """Token dtype and total token count from fairseq's mmap ``.idx`` header.

    Layout (fairseq's ``MMapIndexedDataset.Index``): 9-byte magic, uint64
    version, uint8 dtype code, uint64 sentence count, then int32 sizes. Read
    directly because fairseq's reader first streams the whole index through a
    100 MB buffer, more than the count itself needs.
    """
    from fairseq.data import indexed_dataset

    magic = indexed_dataset.MMapIndexedDataset.Index._HDR_MAGIC
    with open(path, "rb") as stream:
        header = stream.read(len(magic) + 8 + 1 + 8)
    if not header.startswith(magic):
        raise UnigramError(f"{path} is not a fairseq mmap index (--dataset-impl mmap)")
    (version,) = struct.unpack_from("<Q", header, len(magic))
    (code,) = struct.unpack_from("<B", header, len(magic) + 8)
    (sentences,) = struct.unpack_from("<Q", header, len(magic) + 9)
    if version != 1 or code not in indexed_dataset._code_to_dtype:
        raise UnigramError(f"{path}: unknown index version {version} / dtype code {code}")
    sizes = np.memmap(path, dtype=np.int32, mode="r", offset=len(header), shape=(sentences,))
    total = int(sizes.sum(dtype=np.int64)) if sentences else 0
    del sizes
    return indexed_dataset._code_to_dtype[code], total


def _count_generic(prefix, vocab_size, impl):
    """Slower path for the non-default dataset formats (lazy, cached, raw)."""
    from fairseq.data import data_utils

    logger.info("counting %s sentence by sentence (--dataset-impl %s)", prefix, impl)
    dataset = data_utils.load_indexed_dataset(prefix, None, impl)
    if dataset is None:
        raise UnigramError(f"could not read {prefix} as --dataset-impl {impl}")
    counts = np.zeros(vocab_size, dtype=np.int64)
    batch = []
    for i in range(len(dataset)):
        batch.append(np.asarray(dataset[i]))
        if len(batch) == 10000 or i == len(dataset) - 1:
            counts += _bincount_checked(np.concatenate(batch), vocab_size, prefix)
            batch = []
    return counts


def _bincount_checked(ids: np.ndarray, vocab_size: int, where: str) -> np.ndarray:
    ids = ids.astype(np.int64, copy=False)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise UnigramError(
            f"{where} holds token id {int(ids.max())} but the target dictionary "
            f"has {vocab_size} entries: the data was binarised with another "
            "dictionary. Re-run fairseq-preprocess, or point --natbias-counts / "
            "the data directory at matching files."
        )
    return np.bincount(ids, minlength=vocab_size)


def count_target_tokens(
    data: str, split: str, source_lang: str, target_lang: str, vocab_size: int
) -> np.ndarray:
    """Counts over every target-side file fairseq would train on."""
    splits = find_target_splits(data, split, source_lang, target_lang)
    if not splits:
        pattern = os.path.join(
            data.split(":")[0], f"{split}.{source_lang}-{target_lang}.{target_lang}"
        )
        raise UnigramError(
            f"no binarised target training split found (looked for {pattern}.bin "
            f"and the {target_lang}-{source_lang} order in every path of {data!r}). "
            "--natbias-init unigram counts the target side of the training data: "
            "binarise it with fairseq-preprocess --trainpref, or choose "
            "--natbias-init file --natbias-counts PATH (counts from another corpus), "
            "zero, or none."
        )
    counts = np.zeros(vocab_size, dtype=np.int64)
    for target in splits:
        counts += count_binarized(target.prefix, vocab_size, target.impl)
    if counts.sum() == 0:
        raise UnigramError(
            f"the target training split(s) {[t.prefix for t in splits]} hold no "
            "tokens; there is nothing to estimate a unigram from."
        )
    logger.info(
        "target unigram: %d tokens counted in %s",
        int(counts.sum()),
        ", ".join(t.prefix for t in splits),
    )
    return counts


def check_smoothing(alpha: float) -> float:
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
        raise UnigramError(
            f"--natbias-smoothing must be a finite number > 0, got {alpha!r}: "
            "tokens that never occur as targets (<pad>, <s>, rare pieces) would "
            "get log 0 = -inf. The default 1.0 is add-one (Laplace) smoothing."
        )
    return float(alpha)


def unigram_log_probs(counts: Sequence[int], alpha: float = 1.0) -> torch.Tensor:
    """``log p(v) = log(c(v) + alpha) - log(N + alpha |V|)``, float32, all finite."""
    alpha = check_smoothing(alpha)
    counts = torch.as_tensor(np.asarray(counts), dtype=torch.float64)
    smoothed = counts + alpha
    return (smoothed.log() - smoothed.sum().log()).float()


# --- counts files (App. A.7: a bias estimated on another corpus) -------------


def write_counts_file(path: str, dictionary, counts: Sequence[int]) -> None:
    """One ``symbol<TAB>count`` line per dictionary entry, in dictionary order."""
    if len(counts) != len(dictionary):
        raise UnigramError("counts and dictionary differ in length")
    with open(path, "w", encoding="utf-8") as out:
        out.write(COUNTS_FILE_HEADER + "\n")
        for index, count in enumerate(counts):
            out.write(f"{dictionary[index]}\t{int(count)}\n")


def read_counts_file(path: str, dictionary) -> np.ndarray:
    """Counts aligned to ``dictionary``; refuses a file made for another one."""
    if not os.path.isfile(path):
        raise UnigramError(
            f"--natbias-counts {path}: no such file. Make one with "
            "`natbias-count --dict DICT --text TOKENISED.txt --output PATH`."
        )
    by_symbol = {}
    with open(path, encoding="utf-8") as lines:
        header = lines.readline().rstrip("\n")
        if header != COUNTS_FILE_HEADER:
            raise UnigramError(
                f"{path} does not start with {COUNTS_FILE_HEADER!r}; it is not a "
                "counts file written by natbias-count."
            )
        for number, line in enumerate(lines, start=2):
            symbol, sep, count = line.rstrip("\n").rpartition("\t")
            if not sep or not re.fullmatch(r"\d+", count):
                raise UnigramError(
                    f"{path}:{number}: expected 'symbol<TAB>count', got {line!r}"
                )
            by_symbol[symbol] = int(count)
    symbols = [dictionary[i] for i in range(len(dictionary))]
    missing = [s for s in symbols if s not in by_symbol]
    extra = sorted(set(by_symbol) - set(symbols))
    if missing or extra:
        raise UnigramError(
            f"{path} does not match the target dictionary ({len(symbols)} "
            f"entries): {len(missing)} dictionary symbols missing (e.g. "
            f"{missing[:5]}), {len(extra)} unknown symbols (e.g. {extra[:5]}). "
            "Make the counts file with the same dictionary the model trains "
            "with: `natbias-count --dict DATA/dict.TGT.txt ...`."
        )
    counts = np.array([by_symbol[s] for s in symbols], dtype=np.int64)
    if counts.sum() == 0:
        raise UnigramError(f"{path} holds only zero counts")
    return counts


def count_text(lines, dictionary) -> np.ndarray:
    """Counts of space-separated tokenised text, mapped as fairseq binarises it.

    Each line ends in EOS; pieces outside the dictionary count as ``<unk>``.
    """
    counts = np.zeros(len(dictionary), dtype=np.int64)
    batch = []
    for line in lines:
        batch.extend(dictionary.index(token) for token in line.split())
        batch.append(dictionary.eos())
        if len(batch) >= COUNT_CHUNK_TOKENS:
            counts += np.bincount(np.asarray(batch), minlength=len(dictionary))
            batch = []
    if batch:
        counts += np.bincount(np.asarray(batch), minlength=len(dictionary))
    return counts
