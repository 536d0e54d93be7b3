"""Counting the target unigram (natbias.counts, fairseq_natbias.training_data) and
its smoothing (natbias.prior): counts, shards, counts files, errors."""

import collections
import math
import shutil

import numpy as np
import pytest
import torch
from fairseq.data import Dictionary

from fairseq_natbias import training_data
from natbias import counts as natbias_counts
from natbias import prior
from natbias.errors import NaturalBiasError


def hand_counts(text_path, dictionary):
    """Independent count: fairseq's binariser maps each piece to its id and
    appends EOS to every line."""
    counter = collections.Counter()
    for line in text_path.read_text(encoding="utf-8").splitlines():
        counter.update(dictionary.index(w) for w in line.split())
        counter[dictionary.eos()] += 1
    return np.array([counter[i] for i in range(len(dictionary))])


def test_counts_equal_hand_count_of_target_text(toy_text, toy_bin):
    dictionary = Dictionary.load(str(toy_bin / "dict.tgt.txt"))
    counts = training_data.count_translation_targets(
        str(toy_bin), "train", "src", "tgt", len(dictionary)
    )
    np.testing.assert_array_equal(counts, hand_counts(toy_text / "train.tgt", dictionary))
    assert counts[dictionary.eos()] == 400  # one EOS per sentence, which dict.txt drops


def test_joined_dictionary_counts_target_side_only(toy_text, toy_bin_joined):
    dictionary = Dictionary.load(str(toy_bin_joined / "dict.tgt.txt"))
    counts = training_data.count_translation_targets(
        str(toy_bin_joined), "train", "src", "tgt", len(dictionary)
    )
    np.testing.assert_array_equal(counts, hand_counts(toy_text / "train.tgt", dictionary))
    source_ids = [dictionary.index(f"s{i}") for i in range(40)]
    assert all(dictionary[i].startswith("s") for i in source_ids)
    assert counts[source_ids].sum() == 0


def test_all_shards_and_numbered_splits_count(toy_bin, tmp_path):
    dictionary = Dictionary.load(str(toy_bin / "dict.tgt.txt"))
    single = training_data.count_translation_targets(
        str(toy_bin), "train", "src", "tgt", len(dictionary)
    )
    shard_a, shard_b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(toy_bin, shard_a)
    shutil.copytree(toy_bin, shard_b)
    for ext in ("bin", "idx"):  # a second file in shard b: train1
        shutil.copy(toy_bin / f"train.src-tgt.tgt.{ext}", shard_b / f"train1.src-tgt.tgt.{ext}")
    counts = training_data.count_translation_targets(
        f"{shard_a}:{shard_b}", "train", "src", "tgt", len(dictionary)
    )
    np.testing.assert_array_equal(counts, 3 * single)


def test_chunked_count_equals_single_pass(toy_bin, monkeypatch):
    dictionary = Dictionary.load(str(toy_bin / "dict.tgt.txt"))
    whole = natbias_counts.count_binarised(str(toy_bin / "train.src-tgt.tgt"), len(dictionary))
    monkeypatch.setattr(natbias_counts, "CHUNK_TOKENS", 7)
    chunked = natbias_counts.count_binarised(str(toy_bin / "train.src-tgt.tgt"), len(dictionary))
    np.testing.assert_array_equal(whole, chunked)


def test_add_alpha_smoothing_by_hand():
    # counts (0, 1, 3), alpha 1: p = (1, 2, 4) / 7
    log_p = prior.log_unigram([0, 1, 3], alpha=1.0)
    expected = [math.log(1 / 7), math.log(2 / 7), math.log(4 / 7)]
    assert torch.allclose(log_p, torch.tensor(expected), atol=1e-6)
    # alpha 0.5: p = (0.5, 1.5, 3.5) / 5.5
    log_p = prior.log_unigram([0, 1, 3], alpha=0.5)
    assert math.isclose(log_p[0].item(), math.log(0.5 / 5.5), rel_tol=1e-6)
    assert torch.isfinite(log_p).all()


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_smoothing_is_refused(alpha):
    with pytest.raises(NaturalBiasError, match="natbias-smoothing"):
        prior.log_unigram([1, 2], alpha=alpha)


def test_missing_split_names_path_and_alternatives(tmp_path):
    with pytest.raises(NaturalBiasError) as error:
        training_data.count_translation_targets(str(tmp_path), "train", "de", "en", 10)
    message = str(error.value)
    assert "train.de-en.en" in message and "--natbias-init file" in message
    assert "zero" in message and "none" in message


def test_foreign_dictionary_is_refused(toy_bin):
    with pytest.raises(NaturalBiasError, match="outside the vocabulary"):
        natbias_counts.count_binarised(str(toy_bin / "train.src-tgt.tgt"), 5)


def test_counts_file_round_trip_and_mismatch(toy_bin, toy_text, tmp_path):
    dictionary = Dictionary.load(str(toy_bin / "dict.tgt.txt"))
    with open(toy_text / "train.tgt", encoding="utf-8") as lines:
        counts = natbias_counts.count_text(
            lines, dictionary.index, dictionary.eos(), len(dictionary)
        )
    np.testing.assert_array_equal(counts, hand_counts(toy_text / "train.tgt", dictionary))
    path = tmp_path / "train.counts"
    natbias_counts.write_counts_file(str(path), training_data.symbols(dictionary), counts)
    np.testing.assert_array_equal(
        natbias_counts.read_counts_file(str(path), training_data.symbols(dictionary)), counts
    )

    other = Dictionary.load(str(toy_bin / "dict.src.txt"))
    with pytest.raises(NaturalBiasError, match="does not match the vocabulary"):
        natbias_counts.read_counts_file(str(path), training_data.symbols(other))
    with pytest.raises(NaturalBiasError, match="no such file"):
        natbias_counts.read_counts_file(
            str(tmp_path / "missing"), training_data.symbols(dictionary)
        )
    bad = tmp_path / "bad.counts"
    for content in (b"hello\n", b"PK\x03\x04\x80\xff\n"):  # text, and a binary file
        bad.write_bytes(content)
        with pytest.raises(NaturalBiasError, match="not a counts file"):
            natbias_counts.read_counts_file(str(bad), training_data.symbols(dictionary))
