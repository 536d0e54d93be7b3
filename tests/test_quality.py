"""examples/paper/quality.py: sacreBLEU scores with signatures, checked
against BLEU worked by hand, and bad input refused with a message."""

import math

import pytest
from quality import bleu_score, quality

from natbias.errors import NaturalBiasError


def test_bleu_equals_the_hand_worked_geometric_mean_of_precisions():
    # "the cat sat on the mat" against "the cat sat on a mat": 6 tokens each
    # (BP = 1); clipped n-gram matches 5/6, 3/5, 2/4, 1/3.
    scores = quality(["the cat sat on the mat"], ["the cat sat on a mat"])
    by_hand = 100 * math.exp(sum(math.log(p) for p in (5 / 6, 3 / 5, 2 / 4, 1 / 3)) / 4)
    assert scores["BLEU"] == pytest.approx(by_hand, abs=1e-6)
    assert 0 < scores["chrF"] < 100


def test_brevity_penalty_of_a_short_hypothesis_by_hand():
    # a 4-token hypothesis, every n-gram matched, against a 6-token reference
    scores = quality(["the cat sat on"], ["the cat sat on a mat"])
    assert scores["BLEU"] == pytest.approx(100 * math.exp(1 - 6 / 4), abs=1e-6)


def test_bleu_score_keeps_the_parts_bleu_is_made_of():
    # the same short hypothesis: c = 4, r = 6, every precision 100, BP exp(-0.5)
    score, signature = bleu_score(["the cat sat on"], ["the cat sat on a mat"])
    assert (score.sys_len, score.ref_len) == (4, 6)
    assert score.precisions == pytest.approx([100.0] * 4)
    assert score.bp == pytest.approx(math.exp(1 - 6 / 4))
    assert score.score == pytest.approx(100 * score.bp)
    assert signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    with pytest.raises(NaturalBiasError, match="2 hypotheses but 1 references"):
        bleu_score(["a", "b"], ["a"])


def test_identical_text_scores_100_and_signatures_name_the_settings():
    text = ["a man rides a bike .", "two dogs play in the snow ."]
    scores = quality(text, text)
    assert scores["BLEU"] == pytest.approx(100.0)
    assert scores["chrF"] == pytest.approx(100.0)
    assert "nrefs:1" in scores["bleu_signature"] and "tok:13a" in scores["bleu_signature"]
    assert "nrefs:1" in scores["chrf_signature"]


def test_mismatched_or_empty_input_is_refused_with_the_fix():
    with pytest.raises(NaturalBiasError, match="2 hypotheses but 1 references"):
        quality(["a", "b"], ["a"])
    with pytest.raises(NaturalBiasError, match="no sentences"):
        quality([], [])


def test_scoring_imports_neither_torch_nor_fairseq(tmp_path):
    # examples/paper/quality.py scores without torch or fairseq, so that the
    # demo and the transformers example that call it start in a moment.
    import subprocess
    import sys

    from natbias_testing import REPO, top_level_imports

    script = tmp_path / "score.py"
    script.write_text(
        f"import sys; sys.path.insert(0, {str(REPO / 'examples/paper')!r})\n"
        "from quality import quality\n"
        "print(quality(['a b c d'], ['a b c d'])['BLEU'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-X", "importtime", str(script)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "100.00000000000004" or float(done.stdout) == 100.0
    imported = top_level_imports(done.stderr)
    assert "sacrebleu" in imported  # the scorer did run
    assert not {"torch", "fairseq", "transformers"} & imported
