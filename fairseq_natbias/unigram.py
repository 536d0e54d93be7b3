"""Target-side unigram statistics: the one counter the model, the criterion and
the tools share.

The paper (Meister et al., 2023, sec. 4.1): "unigram frequencies are computed
on respective training sets after tokenisation is performed". Here that means
the tokens the model is trained to predict, read from the binarised split(s)
fairseq trains on, EOS included (fairseq appends one EOS to every sentence),
never the ``dict.txt`` counts: with ``--joined-dictionary`` those add the
source side, the saved dictionary drops the EOS count, and shipped
vocabularies may carry dummy counts.

What is counted, by task (:func:`count_training_targets`):

translation (``--task translation`` and its kin)
    the target side, ``train.SRC-TGT.TGT`` (or the ``TGT-SRC`` order).
language_modeling (``fairseq-preprocess --only-source``)
    ``train.bin``: the task's next-token targets are every token of the stream
    once (fairseq's TokenBlockDataset cuts the stream into blocks and each
    block is its own target, the source being shifted right), so the counts
    are those of the whole file. ``--add-bos-token`` puts one ``<s>`` in front
    of every block's target too, so one ``<s>`` per block is added (blocks
    found with fairseq's own slicing for ``--sample-break-mode`` and
    ``--tokens-per-sample``). With ``--output-dictionary-size N`` the task maps
    every target id >= N to ``<unk>``, and so do we.

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
from typing import TYPE_CHECKING, List, Optional, Sequence

import numpy as np
import torch

if TYPE_CHECKING:  # bigram imports nothing of ours; this module stays its floor
    from fairseq_natbias.bigram import PairCounter

logger = logging.getLogger(__name__)

# Tokens read per step when counting: bounds the extra memory at one chunk
# as int64 (16 MiB) above the counts themselves.
COUNT_CHUNK_TOKENS = 1 << 21

COUNTS_FILE_HEADER = "#natbias-counts v1"


class UnigramError(ValueError):
    """Bad input to the unigram statistics; the message names the fix."""


class MissingTrainingSplit(UnigramError):
    """No binarised training split where the task would read it."""


@dataclass
class TargetSplit:
    """One binarised target-side file prefix, e.g. ``data/train.de-en.en``."""

    prefix: str
    impl: str


def find_target_splits(
    data: str, split: str, source_lang: str, target_lang: str
) -> List[TargetSplit]:
    """All target-side files fairseq's translation task trains on for ``split``."""

    def prefix_in(shard, split_k):
        for pair in (f"{source_lang}-{target_lang}", f"{target_lang}-{source_lang}"):
            yield os.path.join(shard, f"{split_k}.{pair}.{target_lang}")

    return _find_splits(data, split, prefix_in)


def find_lm_splits(data: str, split: str) -> List[TargetSplit]:
    """All files fairseq's language_modeling task trains on for ``split``."""
    return _find_splits(data, split, lambda shard, split_k: [os.path.join(shard, split_k)])


def _find_splits(data, split, candidate_prefixes) -> List[TargetSplit]:
    """``data`` may hold several shards separated by ``:`` (fairseq cycles
    through them by epoch); each shard may hold ``train``, ``train1``,
    ``train2``, ... (fairseq concatenates them). All of them count."""
    from fairseq.data import indexed_dataset

    found = []
    for shard in [p for p in data.split(":") if p]:
        k = 0
        while True:
            split_k = split + (str(k) if k > 0 else "")
            existing = [prefix for prefix in candidate_prefixes(shard, split_k)
                        if indexed_dataset.infer_dataset_impl(prefix) is not None]
            if not existing:
                break
            impl = indexed_dataset.infer_dataset_impl(existing[0])
            found.append(TargetSplit(prefix=existing[0], impl=impl))
            k += 1
    return found


def count_binarized(prefix: str, vocab_size: int, impl: str = "mmap",
                    pairs: Optional["PairCounter"] = None) -> np.ndarray:
    """Token counts of one binarised split, as int64 of length ``vocab_size``;
    with ``pairs`` (a :class:`fairseq_natbias.bigram.PairCounter`) the same
    pass counts each token's pair with the one before it (``--natbias-order 2``).

    The mmap format stores all sentences back to back in ``prefix.bin`` with
    the dtype named in ``prefix.idx``, so a chunked ``np.bincount`` over the
    memory-mapped file counts every token once without touching Python per
    sentence.
    """
    counts = np.zeros(vocab_size, dtype=np.int64)
    if pairs is not None:
        pairs.start_stream()
    chunks = _mmap_chunks(prefix) if impl == "mmap" else _generic_chunks(prefix, impl)
    for chunk in chunks:
        counts += _bincount_checked(chunk, vocab_size, prefix)
        if pairs is not None:
            pairs.add(chunk)
    return counts


def _mmap_chunks(prefix):
    """The tokens of an mmap split, COUNT_CHUNK_TOKENS at a time."""
    from fairseq.data import indexed_dataset

    dtype, total = _read_mmap_index(indexed_dataset.index_file_path(prefix))
    itemsize = np.dtype(dtype).itemsize
    data_path = indexed_dataset.data_file_path(prefix)
    if os.path.getsize(data_path) < total * itemsize:
        raise UnigramError(
            f"{data_path} is shorter than its index {prefix}.idx says; the "
            "binarised split is truncated. Re-run fairseq-preprocess."
        )
    if total == 0:
        return
    tokens = np.memmap(data_path, dtype=dtype, mode="r", shape=(total,))
    for start in range(0, total, COUNT_CHUNK_TOKENS):
        yield np.asarray(tokens[start : start + COUNT_CHUNK_TOKENS])
    del tokens


def _read_mmap_index(path):
    """Token dtype and total token count from fairseq's mmap ``.idx`` header."""
    dtype, lengths = _mmap_index(path)
    return dtype, int(lengths.sum(dtype=np.int64)) if len(lengths) else 0


def _mmap_index(path):
    """Token dtype and the memory-mapped int32 sentence lengths of fairseq's
    mmap ``.idx``.

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
    if sentences == 0:
        return indexed_dataset._code_to_dtype[code], np.zeros(0, dtype=np.int32)
    lengths = np.memmap(path, dtype=np.int32, mode="r", offset=len(header), shape=(sentences,))
    return indexed_dataset._code_to_dtype[code], lengths


def _generic_chunks(prefix, impl):
    """Slower path for the non-default dataset formats (lazy, cached, raw):
    10,000 sentences at a time."""
    from fairseq.data import data_utils

    logger.info("counting %s sentence by sentence (--dataset-impl %s)", prefix, impl)
    dataset = data_utils.load_indexed_dataset(prefix, None, impl)
    if dataset is None:
        raise UnigramError(f"could not read {prefix} as --dataset-impl {impl}")
    batch = []
    for i in range(len(dataset)):
        batch.append(np.asarray(dataset[i]))
        if len(batch) == 10000 or i == len(dataset) - 1:
            yield np.concatenate(batch)
            batch = []


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
    data: str, split: str, source_lang: str, target_lang: str, vocab_size: int,
    pairs: Optional["PairCounter"] = None,
) -> np.ndarray:
    """Counts over every target-side file fairseq's translation task would
    train on."""
    splits = find_target_splits(data, split, source_lang, target_lang)
    if not splits:
        pattern = os.path.join(
            data.split(":")[0], f"{split}.{source_lang}-{target_lang}.{target_lang}"
        )
        raise MissingTrainingSplit(
            f"no binarised target training split found (looked for {pattern}.bin "
            f"and the {target_lang}-{source_lang} order in every path of {data!r}). "
            + NO_SPLIT_FIX
        )
    return _sum_counts(splits, vocab_size, pairs)


def count_lm_targets(
    data: str, split: str, vocab_size: int, output_size: Optional[int] = None,
    bos_per_block: Optional["BlockSlicing"] = None, bos: int = 0, unk: int = 3,
    pairs: Optional["PairCounter"] = None,
) -> np.ndarray:
    """Counts of the next-token targets of fairseq's language_modeling task
    (see the module docstring): every token of ``train.bin`` (all shards and
    numbered files), plus one ``bos`` per block when ``bos_per_block`` says how
    the task cuts blocks (``--add-bos-token``), ids >= ``output_size`` folded
    into ``unk`` (``--output-dictionary-size``). Length: ``output_size`` or
    ``vocab_size``."""
    splits = find_lm_splits(data, split)
    if not splits:
        raise MissingTrainingSplit(
            f"no binarised training split found for the language model (looked "
            f"for {os.path.join(data.split(':')[0], split)}.bin, as "
            f"`fairseq-preprocess --only-source --trainpref ...` writes it, in "
            f"every path of {data!r}). " + NO_SPLIT_FIX
        )
    if pairs is not None and output_size is not None and 0 <= output_size < vocab_size:
        raise UnigramError(
            f"--natbias-order 2 with --output-dictionary-size {output_size}: the bigram "
            "table pairs input and output tokens of one dictionary. Drop one of the two.")
    counts = _sum_counts(splits, vocab_size, pairs)
    if bos_per_block is not None:
        counts[bos] += sum(bos_per_block.blocks(target.prefix) for target in splits)
    if output_size is not None and 0 <= output_size < vocab_size:
        counts[unk] += counts[output_size:].sum()
        counts = counts[:output_size].copy()
    return counts


@dataclass
class BlockSlicing:
    """How fairseq's language_modeling task cuts a split into blocks."""

    break_mode: Optional[str]
    tokens_per_sample: int

    def blocks(self, prefix: str) -> int:
        from fairseq.data.token_block_utils_fast import _get_slice_indices_fast

        sizes = _sentence_sizes(prefix)
        mode = str(self.break_mode or "none")  # fairseq passes a ChoiceEnum member
        if mode == "eos":
            return len(sizes)
        return len(_get_slice_indices_fast(sizes, mode, self.tokens_per_sample, 1))


def _sentence_sizes(prefix) -> np.ndarray:
    from fairseq.data import data_utils, indexed_dataset

    if indexed_dataset.infer_dataset_impl(prefix) == "mmap":
        return np.asarray(_mmap_index(indexed_dataset.index_file_path(prefix))[1], dtype=np.int64)
    dataset = data_utils.load_indexed_dataset(prefix, None)
    return np.asarray(dataset.sizes, dtype=np.int64)


def count_training_targets(task, split: str = "train",
                           pairs: Optional["PairCounter"] = None) -> np.ndarray:
    """Counts of the tokens ``task`` trains a model to predict, one per entry
    of its target dictionary: the one entry point for the models, the
    criterion and the tools. ``pairs`` (a
    :class:`fairseq_natbias.bigram.PairCounter`) counts the bigrams in the
    same pass."""
    cfg = task_config(task)
    vocab = len(task.target_dictionary)
    if getattr(cfg, "source_lang", None) and getattr(cfg, "target_lang", None):
        return count_target_tokens(cfg.data, split, cfg.source_lang, cfg.target_lang, vocab,
                                   pairs)
    if hasattr(cfg, "tokens_per_sample") and hasattr(task, "output_dictionary"):
        dictionary = task.source_dictionary  # the ids in train.bin
        slicing = (BlockSlicing(getattr(cfg, "sample_break_mode", None), cfg.tokens_per_sample)
                   if getattr(cfg, "add_bos_token", False) else None)
        output_size = getattr(cfg, "output_dictionary_size", -1)
        return count_lm_targets(
            cfg.data, split, len(dictionary),
            output_size=output_size if output_size is not None and output_size >= 0 else None,
            bos_per_block=slicing, bos=dictionary.bos(), unk=dictionary.unk(), pairs=pairs,
        )
    raise UnigramError(
        f"cannot tell which tokens task {type(task).__name__} trains a model to "
        "predict: the natural bias counts the target side of --task translation "
        "or the text of --task language_modeling. Give the bias from a counts "
        "file instead (--natbias-init file --natbias-counts PATH)."
    )


def task_config(task):
    """A task's options: ``task.cfg`` (dataclass tasks such as translation) or
    ``task.args`` (legacy tasks such as language_modeling, whose cfg is None)."""
    return getattr(task, "cfg", None) or getattr(task, "args", None)


NO_SPLIT_FIX = (
    "--natbias-init unigram counts the tokens the model learns to predict: "
    "binarise them with fairseq-preprocess --trainpref, or choose "
    "--natbias-init file --natbias-counts PATH (counts from another corpus), "
    "zero, or none."
)


def _sum_counts(splits, vocab_size, pairs=None) -> np.ndarray:
    counts = np.zeros(vocab_size, dtype=np.int64)
    for target in splits:
        counts += count_binarized(target.prefix, vocab_size, target.impl, pairs)
    if counts.sum() == 0:
        raise UnigramError(
            f"the training split(s) {[t.prefix for t in splits]} hold no "
            "tokens; there is nothing to estimate a unigram from."
        )
    logger.info(
        "target unigram: %d tokens counted in %s",
        int(counts.sum()),
        ", ".join(t.prefix for t in splits),
    )
    return counts


def check_smoothing(alpha: float, option: str = "--natbias-smoothing") -> float:
    """``alpha`` as a float, or the error naming ``option`` (the models', or a
    criterion's, which should repeat the models' value)."""
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
        advice = ("The default 1.0 is add-one (Laplace) smoothing." if option == "--natbias-smoothing"
                  else "Use the value of --natbias-smoothing (default 1.0, add-one smoothing).")
        raise UnigramError(
            f"{option} must be a finite number > 0, got {alpha!r}: "
            "tokens that never occur as targets (<pad>, <s>, rare pieces) would "
            f"get log 0 = -inf. {advice}"
        )
    return float(alpha)


def unigram_log_probs(counts: Sequence[int], alpha: float = 1.0) -> torch.Tensor:
    """``log p(v) = log(c(v) + alpha) - log(N + alpha |V|)``, float32, all finite."""
    alpha = check_smoothing(alpha)
    counts = torch.as_tensor(np.asarray(counts), dtype=torch.float64)
    smoothed = counts + alpha
    return (smoothed.log() - smoothed.sum().log()).float()


class TrainingUnigram:
    """omega, the target unigram of a task's training split, for a criterion
    (``unigram_regularized_cross_entropy``, ``unigram_label_smoothed_cross_entropy``).

    Counted on first use, not when the criterion is built: fairseq builds
    the criterion before it loads any data, and a criterion that never needs
    omega (a regulariser switched off) must not need the training split
    either. ``fix`` ends the message when the split cannot be counted."""

    def __init__(self, task, split: str, alpha: float, criterion: str, fix: str):
        self.task, self.split, self.alpha = task, split, float(alpha)
        self.criterion, self.fix = criterion, fix
        self._log_probs = None
        self._on = {}  # (device, dtype) -> omega there

    @property
    def counted(self) -> bool:
        return self._log_probs is not None

    def log_probs(self) -> torch.Tensor:
        """log omega(v), float32 on the CPU, one per target-dictionary entry."""
        if self._log_probs is None:
            try:
                counts = count_training_targets(self.task, self.split)
            except UnigramError as error:
                raise UnigramError(f"criterion {self.criterion}: {error} ({self.fix})") from error
            self._log_probs = unigram_log_probs(counts, self.alpha)
        return self._log_probs

    def probs_like(self, like: torch.Tensor) -> torch.Tensor:
        """omega(v) on ``like``'s device, in its dtype."""
        key = (like.device, like.dtype)
        if key not in self._on:
            self._on[key] = self.log_probs().exp().to(like)
        return self._on[key]

    def warn_if_not_the_models(self, model, option: str) -> None:
        """Warn when ``model`` carries a different target unigram (its
        --natbias-smoothing differs from the criterion's ``option``)."""
        theirs = getattr(model, "target_log_unigram", None) if model is not None else None
        if theirs is None or not torch.any(theirs != 0):
            return
        gap = (theirs.detach().float().cpu() - self.log_probs()).abs().max().item()
        if gap > 1e-5:
            logger.warning(
                "%s: the model's target unigram differs from the criterion's by up "
                "to %.3g in log-probability; set %s to the model's --natbias-smoothing",
                self.criterion, gap, option,
            )


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
    with open(path, encoding="utf-8", errors="replace") as lines:
        # errors="replace": a binary file fails the header check below, by name,
        # instead of raising UnicodeDecodeError
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


def count_text(lines, dictionary, pairs: Optional["PairCounter"] = None) -> np.ndarray:
    """Counts of space-separated tokenised text, mapped as fairseq binarises it
    (and its bigrams in ``pairs``, the text being one stream).

    Each line ends in EOS; pieces outside the dictionary count as ``<unk>``.
    """
    counts = np.zeros(len(dictionary), dtype=np.int64)
    if pairs is not None:
        pairs.start_stream()

    def flush(batch):
        tokens = np.asarray(batch, dtype=np.int64)
        if pairs is not None:
            pairs.add(tokens)
        return np.bincount(tokens, minlength=len(dictionary))

    batch = []
    for line in lines:
        batch.extend(dictionary.index(token) for token in line.split())
        batch.append(dictionary.eos())
        if len(batch) >= COUNT_CHUNK_TOKENS:
            counts += flush(batch)
            batch = []
    if batch:
        counts += flush(batch)
    return counts
