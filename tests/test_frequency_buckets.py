"""benchmarks/frequency_buckets.py: tokens into thirds by training frequency,
mean log-probability per third, checked against values worked by hand."""

import math

import pytest

from natbias_testing import benchmark_script


@pytest.fixture(scope="module")
def buckets():
    return benchmark_script("frequency_buckets")


def test_types_go_to_the_third_their_first_token_falls_in(buckets):
    # Sorted by log-unigram: c (2 tokens), a (1), d (3), b (3): 9 tokens.
    # c starts at token 0 -> third 0; a at 2 -> 0; d at 3 -> 1; b at 6 -> 2.
    types = [(-3.0, 1), (-1.0, 3), (-4.0, 2), (-2.0, 3)]
    assert buckets.bucket_of_types(types) == [0, 2, 0, 1]


def write_tokens(path, models):
    """A natbias-frequency CSV over the four types above: {model: logprobs (nats)}."""
    lines = ["model,token_id,symbol,log_unigram,occurrences,avg_logprob_full,"
             "avg_logprob_without_bias"]
    for model, logprobs in models.items():
        for token, ((log_unigram, count), logprob) in enumerate(
                zip([(-3.0, 1), (-1.0, 3), (-4.0, 2), (-2.0, 3)], logprobs)):
            lines.append(f"{model},{token},t{token},{log_unigram},{count},{logprob},0")
    path.write_text("\n".join(lines) + "\n")
    return path


STOCK, CAPPED = (-2.0, -0.5, -3.0, -1.0), (-1.0, -0.5, -2.0, -1.0)


def test_bucket_means_are_occurrence_weighted_in_bits(buckets, tmp_path):
    path = write_tokens(tmp_path / "frequency_tokens.csv", {"stock": STOCK, "capped": CAPPED})
    found = buckets.summarise([("de-en", path), ("de-en", path)])
    ln2 = math.log(2)
    # stock's rare third: a (1 token, -2.0) and c (2 tokens, -3.0): -8/3 nats.
    assert found["de-en"]["stock"][0] == pytest.approx(
        [(-2.0 - 6.0) / 3 / ln2, -1.0 / ln2, -0.5 / ln2])
    assert found["de-en"]["capped"][0][0] == pytest.approx((-1.0 - 4.0) / 3 / ln2)
    table = buckets.markdown(found)
    # capped − stock in the rare third: +1 nat = +1.443 bits, the same both "seeds".
    assert "| de-en | capped | 2 | -2.404 ± 0.000 | -1.443 ± 0.000 | -0.721 ± 0.000 | " \
           "+1.443 ± 0.000 | +0.000 ± 0.000 | +0.000 ± 0.000 |" in table


def test_an_arm_on_fewer_seeds_is_paired_on_the_seeds_it_has(buckets, tmp_path):
    # Seed 1 scored stock and capped; seed 2 stock only, 1 nat lower in every
    # type. Capped − stock is then seed 1's difference alone, +1 nat (rare).
    lower = tuple(x - 1.0 for x in STOCK)
    seed1 = write_tokens(tmp_path / "s1.csv", {"stock": STOCK, "capped": CAPPED})
    seed2 = write_tokens(tmp_path / "s2.csv", {"stock": lower})
    table = buckets.markdown(buckets.summarise([("de-en", seed1), ("de-en", seed2)]))
    assert "| de-en | stock | 2 |" in table
    assert "| de-en | capped | 1 | -2.404 | -1.443 | -0.721 | " \
           "+1.443 | +0.000 | +0.000 |" in table


def test_a_missing_file_is_named(buckets, tmp_path):
    with pytest.raises(SystemExit, match="PAIR=CSV"):
        buckets.main([f"de-en={tmp_path / 'absent.csv'}"])
