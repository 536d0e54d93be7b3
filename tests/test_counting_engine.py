"""The counting engine (natbias.counts: sources, ranks, cache, progress) and
natbias-count's sources: every count equals an ``np.bincount`` made here over
the same ids read another way (np.fromfile, Python lists), for each source,
on one process, on gloo ranks, and read back from the cache."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from natbias_testing import fairseq

from natbias import counts as natbias_counts
from natbias.counts import corpus, sources
from natbias.errors import NaturalBiasError

datasets = pytest.importorskip("datasets")
TESTS = Path(__file__).resolve().parent


def zipf_ids(seed, size, vocab, dtype=np.uint16):
    return np.random.default_rng(seed).zipf(1.3, size).clip(max=vocab - 1).astype(dtype)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 1,000 tokens: every count below crosses chunk boundaries."""
    monkeypatch.setattr(sources, "CHUNK_TOKENS", 1000)


# --- token files ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int32", "uint32", "int64"])
def test_token_files_of_any_dtype_count_as_bincount(tmp_path, small_chunks, dtype):
    ids = [zipf_ids(k, n, 200, dtype) for k, n in ((0, 4321), (1, 999))]
    paths = []
    for k, part in enumerate(ids):
        paths.append(tmp_path / f"part{k}.bin")
        part.tofile(paths[-1])
    counts = natbias_counts.count_token_files(paths, dtype, 256, cache=False)
    expected = np.bincount(
        np.concatenate([np.fromfile(p, dtype=dtype) for p in paths]), minlength=256
    )
    np.testing.assert_array_equal(counts, expected)
    assert counts.dtype == np.int64


def test_instances_lose_their_first_token_and_the_remainder(tmp_path, small_chunks):
    """OLMo-core's rule: instances of L tokens from each file's start, each
    one's first token no target, a remainder shorter than L no instance."""
    path = tmp_path / "part.npy"
    zipf_ids(2, 5000, 300).tofile(path)
    counts = natbias_counts.count_token_files(
        [path], "uint16", 300, instance_length=64, cache=False
    )
    tokens = np.fromfile(path, dtype=np.uint16).tolist()
    expected = np.zeros(300, dtype=np.int64)
    for start in range(0, len(tokens) - 63, 64):  # whole instances only
        for token in tokens[start + 1 : start + 64]:
            expected[token] += 1
    np.testing.assert_array_equal(counts, expected)


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_rank_shares_cover_the_files_once_in_whole_instances(tmp_path, world):
    files = []
    for k, n in enumerate((6400, 1280, 640)):  # 100, 20 and 10 instances of 64
        (tmp_path / f"p{k}").write_bytes(b"\0\0" * n)
        files.append(sources.token_file(tmp_path / f"p{k}", "uint16", 64))
    source = sources.TokenFiles(files)
    covered = {f.path: np.zeros(f.length, dtype=int) for f in files}
    totals = []
    for rank in range(world):
        shares = source.shares(rank, world)
        totals.append(source.total(shares))
        for f, start, stop in shares:
            assert start % 64 == 0 and stop % 64 == 0
            covered[f.path][start:stop] += 1
    assert all((c == 1).all() for c in covered.values())
    assert max(totals) - min(totals) <= 64  # balanced to an instance


def test_fairseq_and_megatron_indexed_datasets(toy_bin, tmp_path):
    """fairseq's index (read by fairseq-preprocess's own output) and
    Megatron's (written here as its MMapIndexedDataset writes it: a document
    count after the sequence count, document indices at the end)."""
    prefix = str(toy_bin / "train.src-tgt.tgt")
    fairseq_counts = natbias_counts.count_indexed([prefix], 64, cache=False)
    tokens = np.fromfile(prefix + ".bin", dtype=natbias_counts.binarised_index(prefix)[0])
    np.testing.assert_array_equal(fairseq_counts, np.bincount(tokens, minlength=64))
    lengths = np.array([3, 5, 0, 7], dtype=np.int32)
    ids = zipf_ids(3, int(lengths.sum()), 50)
    megatron = tmp_path / "megatron"
    ids.tofile(f"{megatron}.bin")
    with open(f"{megatron}.idx", "wb") as index:
        index.write(b"MMIDIDX\x00\x00" + (1).to_bytes(8, "little") + bytes([8]))
        index.write(len(lengths).to_bytes(8, "little") + (3).to_bytes(8, "little"))
        index.write(lengths.tobytes() + np.zeros(4, np.int64).tobytes())
        index.write(np.array([0, 2, 4], np.int64).tobytes())
    counts = natbias_counts.count_indexed([str(megatron)], 50, cache=False)
    np.testing.assert_array_equal(counts, np.bincount(ids, minlength=50))


# --- 🤗 datasets ----------------------------------------------------------------


def rows_of(seed, n, vocab, labels=False):
    rng = np.random.default_rng(seed)
    rows = [zipf_ids(seed * 1000 + i, int(rng.integers(0, 40)), vocab, np.int64).tolist()
            for i in range(n)]  # fmt: skip
    if labels:  # transformers' "no target here"
        rows = [[-100 if rng.random() < 0.2 else t for t in row] for row in rows]
    return rows


def hand_counts(rows, vocab, causal):
    expected = np.zeros(vocab, dtype=np.int64)
    for row in rows:
        for token in row[1:] if causal else row:
            if token != -100:
                expected[token] += 1
    return expected


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_arrow_columns_count_as_the_rows_say(tmp_path, large, causal):
    rows = rows_of(4, 3000, 120, labels=True)
    value = datasets.Value("int32")
    feature = datasets.LargeList(value) if large else datasets.Sequence(value)
    dataset = datasets.Dataset.from_dict(
        {"labels": rows}, features=datasets.Features({"labels": feature})
    )
    dataset.save_to_disk(tmp_path / "saved")
    dataset = datasets.load_from_disk(tmp_path / "saved")
    source = sources.ArrowDataset(dataset, "labels", causal)
    source.ROWS = 700  # several steps, one ending mid-chunk
    counts = corpus.count_source(source, 128, "the dataset", cache=False)
    np.testing.assert_array_equal(counts, hand_counts(rows, 128, causal))
    assert source.total(source.shares(0, 1)) == sum(map(len, rows))


def test_selected_shuffled_and_streamed_datasets(tmp_path):
    from natbias.hf import count_targets

    rows = rows_of(5, 2000, 90)
    dataset = datasets.Dataset.from_dict({"input_ids": rows})
    picked = dataset.shuffle(seed=0).select(range(0, 2000, 3))  # an indices mapping
    expected = hand_counts([picked[i]["input_ids"] for i in range(len(picked))], 90, True)
    np.testing.assert_array_equal(count_targets(picked, 90, causal=True, cache=False), expected)
    stream = dataset.to_iterable_dataset(num_shards=4)
    np.testing.assert_array_equal(
        count_targets(stream, 90, causal=True, cache=False), hand_counts(rows, 90, True)
    )
    parts = sources.StreamingDataset(stream, "input_ids", True)  # each rank's share
    shares = [parts.count(parts.shares(r, 2)[0], 90, lambda n: None) for r in range(2)]
    np.testing.assert_array_equal(shares[0] + shares[1], hand_counts(rows, 90, True))
    assert shares[0].sum() and shares[1].sum()


def test_torch_tensors_count(small_chunks):
    import torch

    rows = rows_of(6, 300, 70)
    tensors = [torch.tensor(row, dtype=torch.long) for row in rows]
    counts = natbias_counts.count_ids(tensors, 70)
    np.testing.assert_array_equal(counts, hand_counts(rows, 70, False))


# --- ranks ----------------------------------------------------------------------


def test_gloo_ranks_get_one_process_counts(tmp_path):
    """3 ranks, then 2, over 2 files that no rank's share divides evenly; a
    bad id in the last rank's share stops every rank with a message (none
    waits for the others). The token files are counted by OLMo-core's rule,
    which natbias.olmo_core.count_targets (here, on one process) applies."""
    pytest.importorskip("olmo_core")
    import olmo_tiny

    from natbias.hf import count_targets as hf_count
    from natbias.olmo_core import count_targets as olmo_count

    for k, n in enumerate((5000, 1777)):
        zipf_ids(k, n, 999).tofile(tmp_path / f"part{k}.npy")
    bad = zipf_ids(9, 10_000, 999)
    bad[9_000] = 1000  # in the last rank's share, of 3 and of 2
    bad.tofile(tmp_path / "bad.npy")
    rows = rows_of(7, 999, 1000)
    datasets.Dataset.from_dict({"input_ids": rows}).save_to_disk(tmp_path / "arrow")
    paths = [str(tmp_path / f"part{k}.npy") for k in range(2)]
    config = olmo_tiny.dataset_config(paths, tmp_path / "work", sequence_length=50)
    single = olmo_count(config, 1024, cache=False)
    arrow = hf_count(datasets.load_from_disk(tmp_path / "arrow"), 1024, causal=True, cache=False)
    np.testing.assert_array_equal(arrow, hand_counts(rows, 1024, True))
    command = [sys.executable, str(TESTS / "counts_gloo_worker.py"), str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.getcwd()]))
    subprocess.run(command, check=True, env=env, timeout=300)
    for world in (3, 2):
        for rank in range(world):
            with np.load(tmp_path / f"world{world}-rank{rank}.npz") as got:
                np.testing.assert_array_equal(got["files"], single)
                np.testing.assert_array_equal(got["arrow"], arrow)
                error = str(got["error"])
            if rank == world - 1:
                assert "bad.npy at token 9000 holds token id 1000" in error, error
            else:
                assert "other rank(s) met bad input" in error, error


# --- the cache ------------------------------------------------------------------


def cached_count(paths, **options):
    return natbias_counts.count_token_files(paths, "uint16", 500, **options)


@pytest.fixture
def token_path(tmp_path):
    path = tmp_path / "tokens.npy"
    zipf_ids(8, 20_000, 500).tofile(path)
    return path


def refuse_to_count(monkeypatch):
    def refuse(*args):
        raise AssertionError("counted again")

    monkeypatch.setattr(sources.TokenFiles, "count", staticmethod(refuse))


def test_a_second_call_reads_the_cache(token_path, tmp_path, monkeypatch):
    first = cached_count([token_path], cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(
        first, np.bincount(np.fromfile(token_path, np.uint16), minlength=500)
    )
    refuse_to_count(monkeypatch)
    np.testing.assert_array_equal(cached_count([token_path], cache_dir=tmp_path / "cache"), first)
    assert len(os.listdir(tmp_path / "cache")) == 1


def test_a_changed_file_or_setting_counts_again(token_path, tmp_path):
    cache = tmp_path / "cache"
    cached_count([token_path], cache_dir=cache)
    by_instance = cached_count([token_path], cache_dir=cache, instance_length=100)
    assert by_instance.sum() == 20_000 - 200  # not the first call's counts
    changed = np.fromfile(token_path, np.uint16)
    changed[:100] = 7
    changed.tofile(token_path)
    os.utime(token_path, ns=(1, 1))  # a modification time of its own, even on a coarse clock
    np.testing.assert_array_equal(
        cached_count([token_path], cache_dir=cache), np.bincount(changed, minlength=500)
    )
    assert len(os.listdir(cache)) == 3


@pytest.mark.parametrize("damage", ["truncated", "foreign"])
def test_a_damaged_cache_is_counted_again_with_a_warning(token_path, tmp_path, damage):
    cache = tmp_path / "cache"
    expected = cached_count([token_path], cache_dir=cache)
    (path,) = cache.iterdir()
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    else:  # the same name, other counts: a file that is not what its key says
        with np.load(path) as saved:
            key = str(saved["key"])
        np.savez(path, key=np.array(key.replace('"vocab_size": 500', '"vocab_size": 501')),
                 counts=np.ones(501, np.int64))  # fmt: skip
    with pytest.warns(UserWarning, match="counting again"):
        np.testing.assert_array_equal(cached_count([token_path], cache_dir=cache), expected)
    with warnings.catch_warnings():  # written anew: read back without a word
        warnings.simplefilter("error")
        np.testing.assert_array_equal(cached_count([token_path], cache_dir=cache), expected)


def test_a_crash_before_the_rename_leaves_no_file(token_path, tmp_path, monkeypatch):
    def crash(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(corpus.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        cached_count([token_path], cache_dir=tmp_path / "cache")
    assert os.listdir(tmp_path / "cache") == []


def test_cache_false_writes_nothing_and_bad_input_is_not_kept(token_path, tmp_path):
    cached_count([token_path], cache_dir=tmp_path / "off", cache=False)
    assert not (tmp_path / "off").exists()
    bad = tmp_path / "bad.npy"
    np.array([1, 2, 600], np.uint16).tofile(bad)
    with pytest.raises(NaturalBiasError):
        cached_count([bad], cache_dir=tmp_path / "bad-cache")
    assert not (tmp_path / "bad-cache").exists()


def test_olmo_core_and_datasets_keep_counts_beside_their_data(tmp_path):
    from natbias.hf import count_targets

    rows = rows_of(9, 500, 64)
    datasets.Dataset.from_dict({"input_ids": rows}).save_to_disk(tmp_path / "saved")
    dataset = datasets.load_from_disk(tmp_path / "saved")
    count_targets(dataset, 64, causal=True)
    kept = [p for p in os.listdir(tmp_path / "saved") if p.startswith(corpus.CACHE_PREFIX)]
    assert len(kept) == 1
    np.testing.assert_array_equal(count_targets(dataset, 64, causal=True),
                                  hand_counts(rows, 64, True))  # fmt: skip


# --- bad input ------------------------------------------------------------------


def test_bad_input_is_one_line_naming_the_fix(tmp_path):
    odd = tmp_path / "odd.npy"
    odd.write_bytes(b"\0" * 7)
    with pytest.raises(NaturalBiasError, match="7 bytes, not a whole number of uint16 ids"):
        natbias_counts.count_token_files([odd], "uint16", 10, cache=False)
    with pytest.raises(NaturalBiasError, match="uint16 holds ids below 65,536, but the tokenizer"):
        natbias_counts.count_token_files([odd], "uint16", 100_000, cache=False)
    high = tmp_path / "high.npy"
    np.array([1, 2, 3, 12, 4], np.uint32).tofile(high)
    with pytest.raises(NaturalBiasError, match=r"high.npy at token 3 holds token id 12, outside"):
        natbias_counts.count_token_files([high], "uint32", 10, cache=False)
    negative = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, -5, 4]]})
    with pytest.raises(NaturalBiasError, match="row 1 holds token id -5"):
        natbias_counts.count_dataset(negative, 10, "input_ids", cache=False)
    empty = datasets.Dataset.from_dict({"input_ids": [[], [7]]})
    with pytest.raises(NaturalBiasError, match="hold no tokens"):
        natbias_counts.count_dataset(empty, 10, "input_ids", causal=True, cache=False)
    text = datasets.Dataset.from_dict({"input_ids": [["a", "b"]]})
    with pytest.raises(NaturalBiasError, match="lists of string, not token ids"):
        natbias_counts.count_dataset(text, 10, "input_ids", cache=False)


# --- progress -------------------------------------------------------------------


def test_a_long_count_shows_a_bar_unless_datasets_bars_are_off(token_path, monkeypatch, capsys):
    monkeypatch.setattr(corpus, "PROGRESS_DELAY", 0.0)  # every count counts as long here
    cached_count([token_path], cache=False)
    bar = capsys.readouterr().err
    assert "natbias: counting targets" in bar and "/20.0k" in bar and "tok/s" in bar
    datasets.disable_progress_bars()
    try:
        cached_count([token_path], cache=False)
    finally:
        datasets.enable_progress_bars()
    assert capsys.readouterr().err == ""


# --- natbias-count --------------------------------------------------------------


def test_natbias_count_writes_counts_by_id_from_tokens_and_datasets(tmp_path):
    for k, n in enumerate((3000, 1234)):
        zipf_ids(k, n, 800).astype(np.uint32).tofile(tmp_path / f"part{k}.bin")
    files = [tmp_path / "part0.bin", tmp_path / "part1.bin"]
    ran = fairseq("natbias-count", "--tokens", *files, "--dtype", "uint32", "--vocab-size", 800,
                  "--workers", 2, "--output", tmp_path / "tokens.counts")  # fmt: skip
    assert "4234 tokens over 800 ids" in ran.stdout
    counts = natbias_counts.read_counts_file(str(tmp_path / "tokens.counts"), range(800))
    expected = np.bincount(
        np.concatenate([np.fromfile(f, np.uint32) for f in files]), minlength=800
    )
    np.testing.assert_array_equal(counts, expected)
    rows = rows_of(10, 400, 300)
    datasets.Dataset.from_dict({"ids": rows}).save_to_disk(tmp_path / "saved")
    fairseq("natbias-count", "--hf-dataset", tmp_path / "saved", "--column", "ids", "--causal",
            "--vocab-size", 300, "--output", tmp_path / "hf.counts")  # fmt: skip
    counts = natbias_counts.read_counts_file(str(tmp_path / "hf.counts"), range(300))
    np.testing.assert_array_equal(counts, hand_counts(rows, 300, True))
    bad = fairseq("natbias-count", "--tokens", files[0], "--dtype", "uint32", "--vocab-size", 100,
                  "--output", tmp_path / "x.counts", check=False)  # fmt: skip
    (line,) = bad.stderr.strip().splitlines()
    assert line.startswith("natbias-count: error: ") and "outside the vocabulary of 100" in line
    assert bad.returncode != 0 and not (tmp_path / "x.counts").exists()
