"""benchmarks/output_length.py: hypothesis/reference length in 13a tokens
over a study's kept translations, checked against counts worked by hand."""

import math

import pytest

from natbias_testing import benchmark_script


@pytest.fixture(scope="module")
def output_length():
    return benchmark_script("output_length")


def test_ratio_counts_13a_tokens(output_length):
    # 13a splits the comma and the full stop off: "Hello , world ." is 4
    # tokens, "a dog" 2 -> c = 6; references 4 + 4 -> r = 8.
    ratio = output_length.length_ratio(output_length.corpus_bleu(
        ["Hello, world.", "a dog"], ["Hello there, world", "a dog runs ."]))
    assert ratio == pytest.approx(6 / 8)


def test_mismatched_line_counts_are_refused(output_length):
    with pytest.raises(SystemExit, match="2 hypotheses but 1 references"):
        output_length.corpus_bleu(["a", "b"], ["a"])


def write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def fake_study(root):
    """WORK/de-en_n3000/short-converge with two seeds of one arm on both
    test sets, laid out as the study keeps them."""
    work = root / "de-en_n3000"
    write(work / "text" / "test.raw.en", ["a b c d", "e f g"])  # r = 7
    write(work / "text-test_2017_flickr" / "test.raw.en", ["a b"])  # r = 2
    runs = work / "short-converge" / "stock"
    write(runs / "seed1" / "test.hyp", ["a b c", "d e"])  # c = 5
    write(runs / "seed2" / "test.hyp", ["a b c d", "e f g"])  # c = 7
    write(runs / "seed1" / "test_2017_flickr.hyp", ["a b c"])  # c = 3
    write(runs / "seed2" / "test_2017_flickr.hyp", ["a"])  # c = 1
    return work / "short-converge"


def test_a_study_folder_gives_each_seed_and_the_mean(output_length, tmp_path, capsys):
    setting = fake_study(tmp_path)
    scores = output_length.setting_scores(output_length.read_setting(setting))["stock"]
    ratios = {test_set: {seed: output_length.length_ratio(score) for seed, score in seeds.items()}
              for test_set, seeds in scores.items()}
    assert ratios["test_2016_flickr"] == pytest.approx({1: 5 / 7, 2: 1.0})
    assert ratios["test_2017_flickr"] == pytest.approx({1: 1.5, 2: 0.5})
    out = tmp_path / "lengths.md"
    output_length.main([str(setting), "--out", str(out)])
    # mean (5/7 + 1) / 2 = 0.857, standard error |1 - 5/7| / 2 = 0.143
    assert "| stock | test_2016_flickr | 0.857 ± 0.143 | 0.714 (seed 1) / 1.000 (seed 2) |" \
        in out.read_text()
    assert "| stock | test_2017_flickr | 1.000 ± 0.500 |" in capsys.readouterr().out


def test_a_kept_validation_translation_counts_as_its_own_set(output_length, tmp_path):
    setting = fake_study(tmp_path)
    write(tmp_path / "de-en_n3000" / "text" / "valid.raw.en", ["a b c d"])  # r = 4
    write(setting / "stock" / "seed1" / "valid.hyp", ["a b c"])  # c = 3 (length_penalty.py's)
    scores = output_length.setting_scores(output_length.read_setting(setting))["stock"]
    assert list(scores) == ["test_2016_flickr", "test_2017_flickr", "valid"]
    assert output_length.length_ratio(scores["valid"][1]) == pytest.approx(3 / 4)


def test_a_folder_without_references_names_what_is_missing(output_length, tmp_path):
    setting = fake_study(tmp_path)
    (tmp_path / "de-en_n3000" / "text" / "test.raw.en").unlink()
    with pytest.raises(SystemExit, match="has no references at .*text/test.raw.en"):
        output_length.main([str(setting)])


def test_a_folder_outside_a_study_pair_is_refused_by_name(output_length, tmp_path):
    setting = tmp_path / "runs" / "short-converge"  # "runs": no SRC-TGT to read
    setting.mkdir(parents=True)
    with pytest.raises(SystemExit, match=r"output_length: 'runs' is not a study pair folder"):
        output_length.main([str(setting)])


def test_reference_length_groups_split_the_ratio(output_length, tmp_path):
    work = tmp_path / "de-en"
    # 13a tokens: "Hello, world." is 4; the long reference 12 words + "." = 13.
    write(work / "text" / "test.raw.en", ["Hello, world.", " ".join(["w"] * 12) + "."])
    setting = work / "paper-converge"
    write(setting / "stock" / "seed1" / "test.hyp", ["Hello.", " ".join(["w"] * 6)])  # 2, 6
    scores = output_length.setting_scores(output_length.read_setting(setting),
                                          by_reference_length=True)["stock"]
    # whole set (2 + 6) / (4 + 13); the groups 2 / 4 and 6 / 13; no sentence of 15 or more
    assert list(scores) == ["test_2016_flickr",
                            "test_2016_flickr, references 1–9 tokens (n = 1)",
                            "test_2016_flickr, references 10–14 tokens (n = 1)"]
    assert [output_length.length_ratio(s[1]) for s in scores.values()] == \
        pytest.approx([8 / 17, 2 / 4, 6 / 13])
    out = tmp_path / "lengths.md"
    output_length.main([str(setting), "--by-reference-length", "--out", str(out)])
    assert "| stock | test_2016_flickr, references 10–14 tokens (n = 1) | 0.462 |" \
        in out.read_text()


def test_brevity_penalty_splits_bleu_into_length_and_words(output_length, tmp_path):
    work = tmp_path / "de-en"
    write(work / "text" / "test.raw.en", ["a b c d e f"])
    setting = work / "paper-converge"
    # every n-gram of "a b c d" is in the reference: precisions 100 %; c = 4, r = 6
    write(setting / "stock" / "seed1" / "test.hyp", ["a b c d"])
    score = output_length.corpus_bleu(["a b c d"], ["a b c d e f"])
    assert output_length.brevity_penalty(score) == pytest.approx(math.exp(1 - 6 / 4))
    assert output_length.bleu_without_brevity_penalty(score) == pytest.approx(100.0)
    no_output = output_length.corpus_bleu([""], ["a b"])
    assert output_length.bleu_without_brevity_penalty(no_output) == 0.0
    out = tmp_path / "lengths.md"
    output_length.main([str(setting), "--brevity-penalty", "--out", str(out)])
    text = out.read_text()
    assert "### de-en paper-converge: brevity penalty (BP)" in text
    assert "| stock | test_2016_flickr | 0.6065 | 0.6065 (seed 1) |" in text  # exp(-0.5)
    assert "| stock | test_2016_flickr | 100.00 | 100.00 (seed 1) |" in text
    assert "| stock | test_2016_flickr | 0.667 | 0.667 (seed 1) |" in text  # 4 / 6


def test_words_split_the_length_into_surplus_and_missing(output_length, tmp_path):
    work = tmp_path / "de-en"
    # r: "A man is playing ." and "A dog runs ." -> 5 + 4 = 9 tokens
    write(work / "text" / "test.raw.en", ["A man is playing.", "A dog runs."])
    setting = work / "paper-converge"
    # stock: "is" once beyond the reference's count, "runs" missing (c = 10)
    write(setting / "stock" / "seed1" / "test.hyp", ["A man is playing.", "A dog is running."])
    # the other arm's two seeds: c = 8 and 9 -> mean 8.5
    write(setting / "natbias" / "seed1" / "test.hyp", ["A man plays.", "A dog runs."])
    write(setting / "natbias" / "seed2" / "test.hyp", ["A man is playing.", "A dog runs."])
    out = tmp_path / "words.md"
    output_length.main([str(setting), "--words", "2", "--out", str(out)])
    text = out.read_text()
    # counts, stock against natbias's mean over its seeds: "is" 2 / 0.5 (1.5 apart),
    # "running" 1 / 0 and "runs" 0 / 1 (1 apart), "playing" 1 / 0.5: "is" first,
    # then "running" before "runs" (a tie, broken by the token's order)
    assert "| `is` | 1 | 2 | 0.5 (-1.5) |" in text
    assert "| `running` | 0 | 1 | 0 (-1) |" in text
    assert "`runs`" not in text
    assert "| all tokens: the length | 9 | 10 | 8.5 (-1.5) |" in text
    # stock: surplus "is" + "running" = 2, missing "runs" = 1 (10 - 9 = 2 - 1);
    # natbias seed 1: surplus "plays" 1, missing "is", "playing" 2; seed 2: 0, 0
    assert "| surplus: beyond the reference's counts | 0 | 2 | 0.5 (-1.5) |" in text
    assert "| missing: the reference's, not produced | 0 | 1 | 1 (+0) |" in text
    with pytest.raises(SystemExit, match="--baseline 'transformer' is not an arm here; "
                                         "the arms: natbias, stock"):
        output_length.main([str(setting), "--words", "2", "--baseline", "transformer"])
