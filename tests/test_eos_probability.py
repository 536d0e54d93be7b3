"""benchmarks/eos_probability.py: teacher-forced mean p(EOS) at non-final
and final target positions, checked on a batch worked by hand and on a
model whose every position predicts one known distribution."""

import math

import pytest
import torch

from fairseq_natbias.pipeline import build_from_training_args
from natbias_testing import TINY_MODEL, benchmark_script


@pytest.fixture(scope="module")
def eos_probability():
    return benchmark_script("eos_probability")


def test_positions_are_split_at_the_end_of_sentence_and_padding_counts_nowhere(eos_probability):
    # vocabulary: 0 bos, 1 pad, 2 eos, 3 a word; sentence 2 is padded.
    target = torch.tensor([[3, 3, 2], [3, 2, 1]])
    p_eos = torch.tensor([[0.1, 0.2, 0.9], [0.3, 0.8, 0.5]])
    probs = torch.full((2, 3, 4), 0.0)
    probs[..., 2] = p_eos
    probs[..., 3] = 1.0 - p_eos
    lprobs = probs.clamp_min(1e-12).log()
    non_final_sum, non_final, final_sum, final = eos_probability.eos_sums(lprobs, target, 2, 1)
    assert (non_final, final) == (3, 2)
    assert non_final_sum == pytest.approx(0.1 + 0.2 + 0.3)  # 0.5 at the padding left out
    assert final_sum == pytest.approx(0.9 + 0.8)


def test_a_context_free_model_gives_its_bias_everywhere(eos_probability, toy_bin):
    # W = 0 leaves logits = b at every position, so p(EOS) = softmax(b)[eos]
    # at non-final and final positions alike.
    _, task, model = build_from_training_args([
        str(toy_bin), "--user-dir", "fairseq_natbias", "--arch", "transformer_natbias",
        *TINY_MODEL, "--cpu", "--seed", "1", "--save-dir", "/nonexistent/ckpt"])
    projection = model.decoder.output_projection
    vocab, eos = len(task.target_dictionary), task.target_dictionary.eos()
    bias = torch.full((vocab,), math.log(0.5 / (vocab - 1)))
    bias[eos] = math.log(0.5)
    with torch.no_grad():
        projection.weight.zero_()
        projection.bias.copy_(bias)
    task.load_dataset("valid")
    non_final, final, n_non_final, n_final = eos_probability.mean_eos_probability(
        model, task, "valid")
    assert non_final == pytest.approx(0.5, rel=1e-5)
    assert final == pytest.approx(0.5, rel=1e-5)
    sentences = len(task.dataset("valid"))
    assert n_final == sentences
    assert n_non_final == sum(task.dataset("valid").tgt_sizes) - sentences
