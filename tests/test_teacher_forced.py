"""benchmarks/teacher_forced.py: teacher-forced NLL, top-1 accuracy, entropy
and p(EOS), checked on a batch worked by hand, on a model whose every
position predicts one known distribution, and on the paired table."""

import math

import pytest
import torch

from fairseq_natbias.pipeline import build_from_training_args
from natbias_testing import TINY_MODEL, benchmark_script


@pytest.fixture(scope="module")
def teacher_forced():
    return benchmark_script("teacher_forced")


def test_a_batch_worked_by_hand_and_padding_counts_nowhere(teacher_forced):
    # vocabulary: 0 bos, 1 pad, 2 eos, 3 a word; sentence 2 is padded.
    target = torch.tensor([[3, 3, 2], [3, 2, 1]])
    p_eos = torch.tensor([[0.1, 0.6, 0.9], [0.3, 0.8, 0.5]])
    probs = torch.zeros(2, 3, 4)
    probs[..., 2] = p_eos
    probs[..., 3] = 1.0 - p_eos
    sums = teacher_forced.batch_sums(probs.clamp_min(1e-30).log(), target, 2, 1)
    assert (sums["tokens"], sums["final"]) == (5, 2)
    # references' probabilities: 0.9, 0.4, 0.9 | 0.7, 0.8 (0.5 at the padding left out)
    assert sums["nll"] == pytest.approx(-math.log(0.9 * 0.4 * 0.9 * 0.7 * 0.8), rel=1e-5)
    # argmax: 3, 2, 2 | 3, 2 -> right at positions 1, 3, 4, 5, wrong at 2
    assert sums["top1"] == 4
    entropy = sum(-(p * math.log(p) + (1 - p) * math.log(1 - p)) for p in (0.1, 0.6, 0.9, 0.3, 0.8))
    assert sums["entropy"] == pytest.approx(entropy, rel=1e-5)
    assert sums["eos_non_final"] == pytest.approx(0.1 + 0.6 + 0.3)
    assert sums["eos_final"] == pytest.approx(0.9 + 0.8)
    means = teacher_forced.means(sums)
    assert means["top1"] == pytest.approx(0.8)
    assert means["nll"] == pytest.approx(sums["nll"] / 5 / math.log(2))
    assert means["eos_non_final"] == pytest.approx(1.0 / 3)


def test_a_context_free_model_gives_its_bias_at_every_position(teacher_forced, toy_bin):
    # W = 0 leaves logits = b at every position: p(EOS) = 1/2 everywhere,
    # the other half spread evenly, so the entropy and the NLL follow by hand.
    _, task, model = build_from_training_args([
        str(toy_bin), "--user-dir", "fairseq_natbias", "--arch", "transformer_natbias",
        *TINY_MODEL, "--cpu", "--seed", "1", "--save-dir", "/nonexistent/ckpt"])
    projection = model.decoder.output_projection
    vocab, eos = len(task.target_dictionary), task.target_dictionary.eos()
    other = 0.5 / (vocab - 1)
    bias = torch.full((vocab,), math.log(other))
    bias[eos] = math.log(0.5)
    with torch.no_grad():
        projection.weight.zero_()
        projection.bias.copy_(bias)
    task.load_dataset("valid")
    result = teacher_forced.teacher_forced(model, task, "valid")
    dataset = task.dataset("valid")
    sentences, tokens = len(dataset), int(sum(dataset.tgt_sizes))
    assert result["tokens"] == tokens
    assert result["eos_non_final"] == pytest.approx(0.5, rel=1e-5)
    assert result["eos_final"] == pytest.approx(0.5, rel=1e-5)
    assert result["top1"] == pytest.approx(sentences / tokens)  # the mode is EOS: right only at the ends
    entropy = -(0.5 * math.log2(0.5) + (vocab - 1) * other * math.log2(other))
    assert result["entropy"] == pytest.approx(entropy, rel=1e-5)
    nll = (sentences * 1.0 + (tokens - sentences) * -math.log2(other)) / tokens
    assert result["nll"] == pytest.approx(nll, rel=1e-5)


def test_later_arms_are_differences_to_the_first_paired_by_seed(teacher_forced):
    def values(nll, top1):
        return {"nll": nll, "top1": top1, "entropy": 2.0, "eos_non_final": 0.002,
                "eos_final": 0.9, "tokens": 100}

    results = [("stock", "1", values(2.5, 0.60)), ("stock", "2", values(2.4, 0.62)),
               ("ul", "1", values(2.4, 0.59)), ("ul", "2", values(2.36, 0.62)),
               ("ul", "3", values(9.9, 0.10))]  # no stock seed 3: left out of the pairs
    text = teacher_forced.tables(results)
    assert "| ul, seed 3 | 9.9000 |" in text
    difference = next(line for line in text.splitlines() if line.startswith("| ul − stock"))
    # NLL -0.1 and -0.04: mean -0.07, s.e. 0.03; top-1 -0.01 and 0: -0.005 ± 0.005
    assert difference.startswith("| ul − stock (seeds 1, 2) | -0.0700 ± 0.0300 | -0.0050 ± 0.0050 |")


def test_a_name_without_a_file_is_refused_with_the_form_to_use(teacher_forced, tmp_path):
    with pytest.raises(SystemExit, match="ARM:SEED=CHECKPOINT"):
        teacher_forced.parse_name(f"stock:1={tmp_path / 'missing.pt'}")
