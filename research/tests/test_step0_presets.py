"""research/step0_presets.py: the presets it finds, and the rows it measures
for the smallest translation and language-model presets on the toy data,
checked against counts made here from the text and the model's shapes."""

import math

import pytest
from fairseq.data import Dictionary
from research_scripts import benchmark_script
from test_counts import hand_counts
from test_transformer_natbias import hand_log_unigram

# The smallest preset of each kind (fewest parameters at equal vocabulary).
SMALLEST = {"translation": "transformer_natbias_iwslt_de_en", "lm": "transformer_lm_natbias_tiny"}
KNOWN = {
    "transformer_natbias": "translation",
    "transformer_natbias_iwslt_de_en": "translation",
    "transformer_natbias_wmt_en_de": "translation",
    "transformer_natbias_afromt": "translation",
    "transformer_lm_natbias": "lm",
    "transformer_lm_natbias_gpt": "lm",
    "transformer_lm_natbias_gpt2_small": "lm",
    "transformer_lm_natbias_tiny": "lm",
}


@pytest.fixture(scope="module")
def script():
    return benchmark_script("step0_presets")


def hand_unigram_ce(text_dir, train, valid, dictionary):
    """Bits per validation target token under the add-one training unigram,
    each line's pieces mapped by the dictionary plus its EOS."""
    log_u = hand_log_unigram(text_dir / train, dictionary)
    counts = hand_counts(text_dir / valid, dictionary)
    return -(counts * log_u).sum() / counts.sum() / math.log(2), int(counts.sum())


def test_finds_every_known_preset_with_its_task(script):
    found = dict(script.presets())
    assert {arch: found.get(arch) for arch in KNOWN} == KNOWN
    assert all(arch.startswith(script.PREFIXES) for arch in found)


def check_rows(rows, dictionary, text_dir, train, valid, matrices_untied, embed_dim):
    """Both rows against the hand count; untied has ``matrices_untied - 1``
    more |V| x d matrices than tied (the sharing, and nothing else, differs)."""
    unigram_ce, tokens = hand_unigram_ce(text_dir, train, valid, dictionary)
    untied, tied = rows
    assert (untied["tying"], untied["tied_by_preset"]) == ("untied", False)
    assert tied["tying"].startswith("tied (--share-")
    for row in rows:
        assert row["tokens"] == tokens
        assert row["unigram_ce"] == pytest.approx(unigram_ce, abs=1e-4)
        assert row["difference"] == pytest.approx(row["nll"] - unigram_ce, abs=1e-4)
        assert abs(row["difference"]) < 0.3, row
        assert row["within"] is True
    assert untied["parameters"] - tied["parameters"] == (
        (matrices_untied - 1) * len(dictionary) * embed_dim
    )


def test_smallest_translation_preset(script, toy_text, toy_bin_joined, tmp_path):
    rows = script.measure_preset(
        SMALLEST["translation"], script.TASKS["translation"], toy_bin_joined, tmp_path / "none"
    )
    dictionary = Dictionary.load(str(toy_bin_joined / "dict.tgt.txt"))
    # Untied: encoder embedding, decoder embedding, output projection (d = 256).
    check_rows(
        rows, dictionary, toy_text, "train.tgt", "valid.tgt", matrices_untied=3, embed_dim=256
    )


def test_smallest_lm_preset_and_the_cache(script, toy_text, toy_lm_bin, tmp_path):
    heard = {}
    task = script.TASKS["lm"]
    rows = script.measure_preset(
        SMALLEST["lm"], task, toy_lm_bin, tmp_path / "none", on_row=heard.__setitem__
    )
    dictionary = Dictionary.load(str(toy_lm_bin / "dict.txt"))
    check_rows(
        rows, dictionary, toy_text, "train.tgt", "valid.tgt", matrices_untied=2, embed_dim=128
    )
    # Rows given back are reused as they are, nothing rebuilt.
    assert sorted(heard) == sorted(f"{SMALLEST['lm']} {request}" for request in ("untied", "tied"))
    again = script.measure_preset(
        SMALLEST["lm"], task, toy_lm_bin, tmp_path / "none", known=heard, on_row=pytest.fail
    )
    assert again == rows
