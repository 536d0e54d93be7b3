"""benchmarks/significance.py: sacreBLEU's paired tests of a study's kept
translations, each arm against the baseline; the BLEU difference checked
against sacreBLEU's own corpus scores, the p-values against cases whose
answer is known."""

import random

import pytest

from natbias_testing import benchmark_script
from fairseq_natbias.analysis.quality import bleu_score


@pytest.fixture(scope="module")
def significance():
    return benchmark_script("significance")


WORDS = "a man dog woman runs plays sits in on the red blue shirt park street".split()


def sentences(count, rng):
    return [" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(count)]


@pytest.fixture(scope="module")
def corpus():
    rng = random.Random(0)
    return sentences(60, rng), sentences(60, rng), sentences(60, rng)  # references, two systems


def test_a_perfect_system_gets_the_smallest_p_and_the_difference_of_the_scores(significance,
                                                                                corpus):
    references, baseline, _ = corpus
    found = significance.paired_tests(baseline, {"perfect": list(references)}, references)["perfect"]
    difference = (bleu_score(references, references)[0].score
                  - bleu_score(baseline, references)[0].score)
    assert found["difference"] == pytest.approx(difference)
    assert found["bleu"] == pytest.approx(100.0)
    # no resample or shuffle comes near: (0 + 1) / (trials + 1)
    assert found["p_bootstrap"] == pytest.approx(1 / 1001)
    assert found["p_randomization"] == pytest.approx(1 / 10001)


def test_two_equally_random_systems_are_not_told_apart(significance, corpus):
    references, baseline, other = corpus
    found = significance.paired_tests(baseline, {"other": other}, references)["other"]
    assert abs(found["difference"]) < 5
    assert found["p_bootstrap"] > 0.05 and found["p_randomization"] > 0.05


def test_identical_outputs_are_not_tested(significance, corpus):
    references, baseline, _ = corpus
    found = significance.paired_tests(baseline, {"same": list(baseline)}, references)["same"]
    assert found["difference"] == 0.0 and found["p_bootstrap"] is None
    assert found["bleu"] == pytest.approx(bleu_score(baseline, references)[0].score)


def write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_a_study_folder_is_tested_per_test_set_and_seed(significance, corpus, tmp_path):
    references, baseline, _ = corpus
    work = tmp_path / "de-en"
    write(work / "text" / "test.raw.en", references)
    setting = work / "paper-converge"
    write(setting / "stock" / "seed3" / "test.hyp", baseline)
    write(setting / "natbias" / "seed3" / "test.hyp", references)
    write(setting / "copy" / "seed3" / "test.hyp", baseline)
    out = tmp_path / "significance.md"
    significance.main([str(setting), "--out", str(out)])
    text = out.read_text()
    assert "| natbias | test_2016_flickr | 3 | 100.00 | +" in text
    assert "| 0.0010 | 0.0001 |" in text
    assert "| copy | test_2016_flickr | 3 |" in text and "– (identical) | – (identical) |" in text
    with pytest.raises(SystemExit, match="--baseline 'transformer' has no translation of "
                                         "test_2016_flickr for seed 3"):
        significance.main([str(setting), "--baseline", "transformer"])
    write(setting / "short" / "seed3" / "test.hyp", baseline[:10])
    with pytest.raises(SystemExit, match="short has 10 translations but there are 60 references"):
        significance.main([str(setting)])
