"""natbias-count, the console script for counts files (App. A.7)."""

import re

import numpy as np
from fairseq.data import Dictionary
from natbias_testing import fairseq
from test_counts import hand_counts

from fairseq_natbias import training_data
from natbias import counts as natbias_counts


def natbias_count(*args):
    return fairseq("natbias-count", *args, check=False)


def test_counts_from_text_and_from_binarised_data_agree(toy_bin, toy_text, tmp_path):
    dict_path = toy_bin / "dict.tgt.txt"
    dictionary = Dictionary.load(str(dict_path))
    from_text, from_bin = tmp_path / "text.counts", tmp_path / "bin.counts"
    assert (
        natbias_count(
            "--dict", dict_path, "--text", toy_text / "train.tgt", "--output", from_text
        ).returncode
        == 0
    )
    assert (
        natbias_count(
            "--dict",
            dict_path,
            "--data",
            toy_bin,
            "--source-lang",
            "src",
            "--target-lang",
            "tgt",
            "--output",
            from_bin,
        ).returncode
        == 0
    )
    expected = hand_counts(toy_text / "train.tgt", dictionary)
    np.testing.assert_array_equal(
        natbias_counts.read_counts_file(str(from_text), training_data.symbols(dictionary)), expected
    )
    np.testing.assert_array_equal(
        natbias_counts.read_counts_file(str(from_bin), training_data.symbols(dictionary)), expected
    )


def test_missing_split_is_a_clear_error(toy_bin, tmp_path):
    result = natbias_count(
        "--dict",
        toy_bin / "dict.tgt.txt",
        "--data",
        tmp_path,
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--output",
        tmp_path / "x.counts",
    )
    assert result.returncode != 0
    assert "natbias-count: error: no binarised target training split" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_inputs_are_named_with_the_fix(toy_bin, toy_text, tmp_path):
    """Each a bare traceback in 0.7.0 but the first two (a missing --dict:
    FileNotFoundError; a binary one: fairseq's bare Exception; binary text:
    UnicodeDecodeError) or a counts file silently indexed by the wrong
    dictionary (the last)."""
    binary = tmp_path / "checkpoint.pt"
    binary.write_bytes(b"PK\x03\x04\x80\x81\xfe\n\xff 1\n")
    no_counts = tmp_path / "words.txt"
    no_counts.write_text("the\nis\n", encoding="utf-8")
    other_dict = tmp_path / "dict.other.txt"  # the target's symbols in another order
    lines = (toy_bin / "dict.tgt.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    other_dict.write_text("".join(reversed(lines)), encoding="utf-8")
    target = ["--data", toy_bin, "--source-lang", "src", "--target-lang", "tgt"]
    refusals = [
        (
            ["--dict", tmp_path / "none.txt", "--text", toy_text / "train.tgt"],
            "--dict .*none.txt: no such file; give the target dictionary",
        ),
        (
            ["--dict", binary, "--text", toy_text / "train.tgt"],
            "--dict .*checkpoint.pt is not a fairseq dictionary \\(.*\\); give dict.TGT.txt",
        ),
        (
            ["--dict", no_counts, "--text", toy_text / "train.tgt"],
            "--dict .*words.txt is not a fairseq dictionary",
        ),
        (
            ["--dict", toy_bin / "dict.tgt.txt", "--text", binary],
            "--text .*checkpoint.pt is not UTF-8 text \\(byte 4\\)",
        ),
        (
            ["--dict", other_dict, *target],
            "--dict .*dict.other.txt is not the target dictionary of .*dict.tgt.txt holds other "
            "symbols\\); give --dict .*dict.tgt.txt",
        ),
    ]
    for args, message in refusals:
        output = tmp_path / "x.counts"
        result = natbias_count(*args, "--output", output)
        assert result.returncode != 0, args
        assert re.search(f"natbias-count: error: {message}", result.stderr), result.stderr
        assert "Traceback" not in result.stderr and not output.exists()
