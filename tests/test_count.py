"""natbias-count, the console script for counts files (App. A.7)."""

import numpy as np
from fairseq.data import Dictionary

from fairseq_natbias import unigram
from natbias_testing import fairseq
from test_unigram import hand_counts


def natbias_count(*args):
    return fairseq("natbias-count", *args, check=False)


def test_counts_from_text_and_from_binarised_data_agree(toy_bin, toy_text, tmp_path):
    dict_path = toy_bin / "dict.tgt.txt"
    dictionary = Dictionary.load(str(dict_path))
    from_text, from_bin = tmp_path / "text.counts", tmp_path / "bin.counts"
    assert natbias_count("--dict", dict_path, "--text", toy_text / "train.tgt",
                         "--output", from_text).returncode == 0
    assert natbias_count("--dict", dict_path, "--data", toy_bin, "--source-lang", "src",
                         "--target-lang", "tgt", "--output", from_bin).returncode == 0
    expected = hand_counts(toy_text / "train.tgt", dictionary)
    np.testing.assert_array_equal(unigram.read_counts_file(str(from_text), dictionary), expected)
    np.testing.assert_array_equal(unigram.read_counts_file(str(from_bin), dictionary), expected)


def test_missing_split_is_a_clear_error(toy_bin, tmp_path):
    result = natbias_count("--dict", toy_bin / "dict.tgt.txt", "--data", tmp_path,
                           "--source-lang", "src", "--target-lang", "tgt",
                           "--output", tmp_path / "x.counts")
    assert result.returncode != 0
    assert "natbias-count: error: no binarised target training split" in result.stderr
    assert "Traceback" not in result.stderr
