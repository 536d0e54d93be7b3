"""Counting a corpus once: split across the ranks of a process group, kept
for restarts. Every adapter's counting of a dataset ends here
(:func:`count_source`), whatever reads the tokens (:mod:`natbias.counts.sources`).

- **Ranks.** Where ``torch.distributed`` is initialised, each rank counts
  its own share of the source and one ``all_reduce`` of the int64 counts
  gives every rank the same counts, equal to one process's. A rank that
  meets bad input says so in the same collective, so that every rank
  stops with the message instead of waiting on the others.
- **Cache.** The counts are stored beside the data they describe
  (``cache_dir``), under a key made of what identifies the data (paths,
  sizes, modification times or a dataset's fingerprint), the vocabulary
  size and the counting rules; a later process reads them back instead of
  counting. Whether to count is decided by all ranks together (one rank's
  miss makes every rank count), the file is written by rank 0 alone, to a
  temporary name then renamed (a crash leaves no half file), and a file
  that cannot be read or holds something else is counted again with a
  one-line warning, never trusted.
- **Progress.** A tqdm bar on rank 0 (tokens, tokens per second, the time
  left) on stderr, shown once a count has run two seconds; silent where
  🤗 datasets' progress bars are disabled.
"""

import hashlib
import json
import os
import sys
import tempfile
import warnings
from collections.abc import Sequence
from typing import Optional

import numpy as np

from natbias.counts.sources import (
    ArrowDataset,
    StreamingDataset,
    TokenFiles,
    indexed_file,
    token_file,
)
from natbias.errors import NaturalBiasError

CACHE_VERSION = 1  # of the cache files' layout and key
CACHE_PREFIX = "natbias-counts-"
PROGRESS_DELAY = 2.0  # seconds a count runs before its bar shows


def count_source(
    source,
    vocab_size: int,
    where: str,
    *,
    cache: bool = True,
    cache_dir: Optional[str] = None,
    rules: Optional[dict] = None,
    quiet_cache: bool = False,
    workers: int = 1,
) -> np.ndarray:
    """The int64 counts (one per id below ``vocab_size``) of ``source`` (a
    :mod:`natbias.counts.sources` source), split across ranks, read from or
    written to the cache in ``cache_dir`` where ``cache`` and the source has
    a key; ``rules``: the settings that change the count, for the key;
    ``quiet_cache``: ``cache_dir`` is a default the user did not name (a data
    directory), where an unwritable folder is no news; ``workers``: processes
    that count this rank's share at once (natbias-count's --workers)."""
    rank, world = _rank_and_world()
    path = None
    if cache and cache_dir is not None:
        key = source.key()
        if key is not None:
            key = {"version": CACHE_VERSION, "vocab_size": vocab_size, "source": key,
                   "rules": rules or {}}  # fmt: skip
            text = json.dumps(key, sort_keys=True, default=str)
            digest = hashlib.sha256(text.encode()).hexdigest()[:20]
            path = os.path.join(os.fspath(cache_dir), f"{CACHE_PREFIX}{digest}.npz")
    cached = _read_cache(path, text, vocab_size) if path else None
    if world > 1 and path:  # count unless every rank read the cache
        missed = _all_reduce(np.array([cached is None], dtype=np.int64))
        cached = cached if missed[0] == 0 else None
    if cached is not None:
        return cached
    if workers > 1 and world == 1:
        counts = _count_in_processes(source, vocab_size, workers)
    else:
        counts = _count_shares(source, vocab_size, rank, world)
    if counts.sum() == 0:  # bad input: refused, and nothing kept
        raise NaturalBiasError(
            f"{where} hold no tokens: there is nothing to estimate a unigram from"
        )
    if path and rank == 0:
        _write_cache(path, text, counts, quiet_cache)
    return counts


def _count_shares(source, vocab_size, rank, world) -> np.ndarray:
    error, counts = None, np.zeros(vocab_size, dtype=np.int64)
    try:
        counts = _count_part((source, vocab_size, rank, world))
    except NaturalBiasError as raised:
        if world == 1:
            raise
        error = raised
    if world == 1:
        return counts
    # One collective carries the counts and whether a rank failed: the others
    # would otherwise wait for a rank that has stopped.
    reduced = _all_reduce(np.append(counts, np.int64(error is not None)))
    if error is not None:
        raise error
    if reduced[-1]:
        raise NaturalBiasError(
            f"{int(reduced[-1])} other rank(s) met bad input counting the targets: see their message"
        )
    return reduced[:-1]


def _count_in_processes(source, vocab_size, workers) -> np.ndarray:
    """One machine without a process group: ``workers`` processes, each
    counting the share a rank of that many would."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        parts = pool.map(_count_part, [(source, vocab_size, k, workers) for k in range(workers)])
        return np.sum(list(parts), axis=0, dtype=np.int64)


def _count_part(task) -> np.ndarray:
    source, vocab_size, rank, world = task
    counts = np.zeros(vocab_size, dtype=np.int64)
    with _progress(source.total(source.shares(rank, world)), rank) as bar:
        for share in source.shares(rank, world):
            counts += source.count(share, vocab_size, bar.update)
    return counts


def _rank_and_world():
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover: torch is a dependency
        return 0, 1
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_reduce(values: np.ndarray) -> np.ndarray:
    """The sum over ranks of an int64 vector, on the device the group's
    backend reduces on (NCCL's on the rank's GPU, gloo's on the CPU)."""
    import torch
    import torch.distributed as dist

    tensor = torch.from_numpy(values.astype(np.int64))
    if dist.get_backend() == "nccl":
        tensor = tensor.to(torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(tensor)
    return tensor.cpu().numpy()


# --- the sources' front doors ---------------------------------------------------


def count_token_files(
    paths: Sequence,
    dtype,
    vocab_size: int,
    *,
    instance_length: Optional[int] = None,
    lengths: Optional[Sequence[int]] = None,
    tokenizer_size: Optional[int] = None,
    cache: bool = True,
    cache_dir: Optional[str] = None,
    quiet_cache: bool = False,
    workers: int = 1,
) -> np.ndarray:
    """Counts of flat token files (numpy ``tofile``: OLMo-core's, nanoGPT's
    ``train.bin``), memory-mapped; ``instance_length``: the files hold
    instances of that many tokens, each one's first no target and a file's
    remainder no instance; ``lengths``: count only each file's first tokens;
    ``tokenizer_size``: the ids the tokenizer makes, where fewer than the
    model's ``vocab_size`` (padded). Split across ranks, cached in
    ``cache_dir`` (:mod:`natbias.counts.corpus`)."""
    ids = tokenizer_size or vocab_size
    if np.dtype(dtype).kind in "iu" and ids > np.iinfo(dtype).max + 1:
        raise NaturalBiasError(
            f"{np.dtype(dtype).name} holds ids below {np.iinfo(dtype).max + 1:,}, but the "
            f"tokenizer has {ids:,}: give the dtype the files were written with "
            "(a wider one, e.g. uint32)"
        )
    files = [
        token_file(path, dtype, instance_length, None if lengths is None else lengths[i])
        for i, path in enumerate(paths)
    ]
    rules = {"instance_length": instance_length}
    return count_source(TokenFiles(files), vocab_size, "the token files", cache=cache,
                        cache_dir=cache_dir, rules=rules, quiet_cache=quiet_cache,
                        workers=workers)  # fmt: skip


def count_indexed(
    prefixes: Sequence[str],
    vocab_size: int,
    *,
    cache: bool = True,
    cache_dir=None,
    quiet_cache: bool = False,
) -> np.ndarray:
    """Counts of every token of fairseq's or Megatron's indexed datasets
    (``PREFIX.bin`` / ``PREFIX.idx``), read without either."""
    files = [indexed_file(prefix) for prefix in prefixes]
    where = ", ".join(f.path for f in files)
    return count_source(TokenFiles(files), vocab_size, where, cache=cache, cache_dir=cache_dir,
                        quiet_cache=quiet_cache)  # fmt: skip


def count_dataset(
    dataset,
    vocab_size: int,
    column: str,
    *,
    causal: bool = False,
    cache: bool = True,
    cache_dir: Optional[str] = None,
    workers: int = 1,
) -> np.ndarray:
    """Counts of a 🤗 dataset's ``column`` of token-id lists, read as Arrow
    arrays: a map-style ``Dataset`` (split across ranks by rows, cached in
    ``cache_dir``, else beside its cache files) or a streaming
    ``IterableDataset`` (split by ``split_dataset_by_node``, never cached).
    ``causal``: each row's first token is no target; -100 is skipped."""
    quiet = cache_dir is None  # the default folder: no warning where it is read-only
    if hasattr(dataset, "cache_files") and hasattr(dataset, "_fingerprint"):
        source = ArrowDataset(dataset, column, causal)
        if cache_dir is None and dataset.cache_files:
            cache_dir = os.path.dirname(dataset.cache_files[0]["filename"])
    else:
        source = StreamingDataset(dataset, column, causal)
    rules = {"column": column, "causal": causal}
    return count_source(source, vocab_size, "the dataset", cache=cache, cache_dir=cache_dir,
                        rules=rules, quiet_cache=quiet, workers=workers)  # fmt: skip


# --- the cache ----------------------------------------------------------------


def _read_cache(path: str, key: str, vocab_size: int) -> Optional[np.ndarray]:
    if not os.path.exists(path):
        return None
    try:
        with np.load(path, allow_pickle=False) as saved:
            stored_key, counts = str(saved["key"]), saved["counts"]
    except Exception as error:  # zipfile, OSError, ValueError, KeyError: all mean unreadable
        warnings.warn(
            f"natbias: the counts cache {path} cannot be read ({type(error).__name__}): "
            "counting again",
            stacklevel=3,
        )
        return None
    if (
        stored_key != key
        or counts.shape != (vocab_size,)
        or counts.dtype != np.int64
        or (counts < 0).any()
    ):
        warnings.warn(
            f"natbias: the counts cache {path} holds counts of other data, settings or "
            "vocabulary: counting again",
            stacklevel=3,
        )
        return None
    return counts


def _write_cache(path: str, key: str, counts: np.ndarray, quiet: bool) -> None:
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=folder)
        try:
            with os.fdopen(handle, "wb") as stream:
                np.savez(stream, key=np.array(key), counts=counts)
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as error:
        if quiet:
            return
        warnings.warn(
            f"natbias: could not keep the counts in {folder} ({error.strerror}): give "
            "cache_dir= a writable folder, or cache=False",
            stacklevel=3,
        )


# --- progress -----------------------------------------------------------------


class _NoBar:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n):
        pass


def _progress(total, rank):
    """A tqdm bar on rank 0, shown after two seconds; silent where 🤗 datasets'
    bars are disabled, on other ranks, or without tqdm."""
    if rank != 0 or _bars_disabled():
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, unit="tok", unit_scale=True, desc="natbias: counting targets",
                delay=PROGRESS_DELAY, file=sys.stderr, leave=False)  # fmt: skip


def _bars_disabled() -> bool:
    if "datasets" not in sys.modules:  # not imported: nobody disabled its bars
        return False
    from datasets.utils.tqdm import are_progress_bars_disabled

    return are_progress_bars_disabled()
