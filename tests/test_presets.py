"""Every registered preset starts at the unigram (Fig. 1 at update 0), at its
own width: the translation presets (d 256 and 512, 6+6 layers) and the
language-model presets up to GPT-2 small's 12 layers of 768. Each fresh
model's validation NLL is the cross-entropy of the training unigram counted
here from the text (within 0.05 bits), its KL from that unigram below 0.03
bits. The toy data keep the big models' validation to a few hundred tokens."""

import math

import pytest
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY
from test_counts import hand_counts
from test_transformer_natbias import hand_log_unigram

import fairseq_natbias  # noqa: F401  (registers the presets)
from fairseq_natbias.in_process import build_from_training_args, validation_divergence

TRANSLATION = sorted(a for a in ARCH_MODEL_REGISTRY if a.startswith("transformer_natbias"))
LM = sorted(a for a in ARCH_MODEL_REGISTRY if a.startswith("transformer_lm_natbias"))


def hand_unigram_ce(text_dir, dictionary):
    """Bits per validation target token (the pieces and each line's EOS) under
    the add-one unigram of the training targets."""
    log_u = hand_log_unigram(text_dir / "train.tgt", dictionary)
    counts = hand_counts(text_dir / "valid.tgt", dictionary)
    return -(counts * log_u).sum() / counts.sum() / math.log(2), int(counts.sum())


def check_step0(argv, text_dir, dictionary_path):
    _, task, model = build_from_training_args(argv)
    unigram_ce, tokens = hand_unigram_ce(text_dir, Dictionary.load(str(dictionary_path)))
    fresh = validation_divergence(task, model)
    assert fresh["tokens"] == tokens
    assert abs(fresh["nll"] - unigram_ce) < 0.05, (fresh, unigram_ce)
    assert fresh["kl_unigram"] < 0.03, fresh


COMMON = ["--user-dir", "fairseq_natbias", "--cpu", "--seed", "1", "--save-dir", "/nonexistent"]


@pytest.mark.parametrize("arch", TRANSLATION)
def test_a_translation_preset_starts_at_the_unigram(arch, toy_text, toy_bin_joined):
    argv = [str(toy_bin_joined), "--arch", arch, "--share-all-embeddings", *COMMON]
    check_step0(argv, toy_text, toy_bin_joined / "dict.tgt.txt")


@pytest.mark.parametrize("arch", LM)
def test_a_language_model_preset_starts_at_the_unigram(arch, toy_text, toy_lm_bin):
    argv = [str(toy_lm_bin), "--task", "language_modeling", "--arch", arch, *COMMON]
    argv += ["--tokens-per-sample", "64", "--sample-break-mode", "eos"]
    check_step0(argv, toy_text, toy_lm_bin / "dict.txt")
