"""Speed and memory of the target-unigram count at WMT scale.

Writes a synthetic Zipfian target split (default 150M tokens, 32k vocabulary,
sentence lengths 5-60) in fairseq's mmap indexed-dataset format (the .bin is
the token stream in the dtype fairseq's binariser picks, the .idx is written by
fairseq's own MMapIndexedDataset.Index writer), then times
natbias.counts.count_binarised on it and records the peak Python heap
(tracemalloc; numpy registers its buffers there) during the count.

    .venv/bin/python research/bench_counting.py [--tokens 150000000] [--repeat 3]
"""

import argparse
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

# Use this checkout's natbias.
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def write_synthetic_split(prefix, tokens, vocab, seed=0):
    from fairseq.data import indexed_dataset

    rng = np.random.default_rng(seed)
    dtype = indexed_dataset.best_fitting_int_dtype(vocab)
    sizes = []
    total = 0
    with open(indexed_dataset.data_file_path(prefix), "wb") as out:
        while total < tokens:
            n = min(10_000_000, tokens - total)
            # Zipf(1.1) ranks folded into the vocabulary, ids >= 4 (specials first)
            ids = (rng.zipf(1.1, size=n) - 1) % (vocab - 4) + 4
            out.write(ids.astype(dtype).tobytes())
            total += n
    lengths = rng.integers(5, 61, size=tokens // 5 + 1)
    ends = np.cumsum(lengths)
    count = int(np.searchsorted(ends, tokens))
    sizes = np.append(lengths[:count], tokens - (ends[count - 1] if count else 0))
    sizes = sizes[sizes > 0]
    assert sizes.sum() == tokens
    with indexed_dataset.MMapIndexedDataset.Index.writer(
        indexed_dataset.index_file_path(prefix), dtype
    ) as index:
        index.write(sizes.astype(np.int64))


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=150_000_000)
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    from natbias import counts as counting

    workdir = args.workdir or tempfile.mkdtemp(prefix="natbias-bench-")
    os.makedirs(workdir, exist_ok=True)
    prefix = os.path.join(workdir, "train.de-en.en")
    started = time.time()
    if not os.path.exists(prefix + ".idx"):
        write_synthetic_split(prefix, args.tokens, args.vocab)
    print(
        f"wrote {args.tokens:,} tokens in {time.time() - started:.1f} s to {prefix}.bin "
        f"({os.path.getsize(prefix + '.bin') / 2**20:.0f} MiB)",
        flush=True,
    )
    times = []
    for _ in range(args.repeat):
        tracemalloc.start()
        start = time.perf_counter()
        counts = counting.count_binarised(prefix, args.vocab)
        times.append(time.perf_counter() - start)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert counts.sum() == args.tokens
    chunk_bytes = counting.CHUNK_TOKENS * 8
    print(
        f"count_binarised: best {min(times):.2f} s, median {sorted(times)[len(times) // 2]:.2f} s "
        f"over {args.repeat} runs ({args.tokens / min(times) / 1e6:.0f}M tokens/s)"
    )
    print(
        f"peak heap during count: {peak / 2**20:.1f} MiB "
        f"(counts {counts.nbytes / 2**20:.2f} MiB, one chunk as int64 {chunk_bytes / 2**20:.0f} MiB)"
    )
    print(f"command: {sys.executable} {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
