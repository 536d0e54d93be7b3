"""Distinct-n and n-gram diversity D (Kobayashi et al., 2023, eqs. 5 and 6)."""

import math

import pytest
from natbias_testing import console_script_help
from sweep import read_generate_output

from natbias.errors import NaturalBiasError
from natbias.tools import cli as distinct_cli
from natbias.tools import distinct

TEXTS = ["the cat the cat", "the dog"]


def test_distinct_n_by_hand():
    # unigrams: the x3, cat x2, dog        -> 3 unique / 6
    # bigrams:  the-cat x2, cat-the, the-dog -> 3 / 4 (none across the two texts)
    # trigrams: the-cat-the, cat-the-cat   -> 2 / 2;  4-grams: 1 / 1
    scores = distinct.text_diversity(TEXTS, tokenizer="none")
    assert scores == {
        "D1": 3 / 6,
        "D2": 3 / 4,
        "D3": 2 / 2,
        "D4": 1 / 1,
        "D": (3 / 6 + 3 / 4 + 1 + 1) / 4,
    }


def test_13a_splits_punctuation_and_short_texts_leave_d_undefined():
    scores = distinct.text_diversity(["Hello, world.", "Hello!"], tokenizer="13a")
    # tokens: Hello , world . | Hello !  -> 5 unique of 6 unigrams
    assert scores["D1"] == pytest.approx(5 / 6)
    short = distinct.text_diversity(["a b", "c"], tokenizer="none")
    assert math.isnan(short["D3"]) and math.isnan(short["D"])
    with pytest.raises(NaturalBiasError):
        distinct.text_diversity([])


def test_cli_reads_the_detokenised_hypotheses_of_fairseq_generate(tmp_path, capsys):
    output = tmp_path / "generate-test.txt"
    output.write_text(
        "S-1\tsrc\nT-1\tref\nH-1\t-0.5\tthe dog\nD-1\t-0.5\tthe dog\nP-1\t-1 -1 -1\n"
        "S-0\tsrc\nT-0\tref\nH-0\t-0.5\tthe cat the cat\nD-0\t-0.5\tthe cat the cat\n"
        "Generate test with beam=5: BLEU4 = 0.00\n"
    )
    distinct_cli.distinct_main([str(output), "--tokenize", "none"])
    printed = dict(line.split("\t") for line in capsys.readouterr().out.splitlines())
    assert float(printed["D2"]) == pytest.approx(3 / 4)
    assert float(printed["D"]) == pytest.approx((3 / 6 + 3 / 4 + 1 + 1) / 4, abs=1e-4)


def test_a_file_that_is_not_text_is_named(tmp_path):
    """A checkpoint given for the texts: one line naming it (a bare
    UnicodeDecodeError in 0.7.0), here and in fairseq-generate output's
    reader, which the sweeps use."""
    binary = tmp_path / "checkpoint_best.pt"
    binary.write_bytes(b"PK\x03\x04\x80\xff\n")
    with pytest.raises(
        SystemExit,
        match=r"natbias-distinct: error: .*checkpoint_best.pt is not "
        r"UTF-8 text \(byte 4\); give fairseq-generate's output "
        r"or a plain text file",
    ):
        distinct_cli.distinct_main([str(binary)])
    with pytest.raises(
        NaturalBiasError,
        match=r"is not UTF-8 text \(byte 4\); give "
        r"fairseq-generate's output$",
    ):
        read_generate_output(str(binary))


def test_console_script_help():
    """The installed script runs this package's main; --help describes the tool."""
    assert "distinct-n" in console_script_help("natbias-distinct")
