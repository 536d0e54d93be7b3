"""Documented paths run end to end, each asserting what a user sees, against a
value computed here another way: fairseq-train's --natbias-gain-init (the
saved gain, the bits at update 0 against the unigram counted here), the hub's
from_pretrained (docs/checkpoints.md) against fairseq-generate, and
natbias-frequency-bias's documented --spm example (docs/tools.md)."""

import math

import numpy as np
import pytest
import torch
from natbias_testing import log_records, train

from fairseq_natbias import checkpoint_loading  # noqa: F401  (torch.load of fairseq's checkpoints)

LN2 = math.log(2)


def hand_counts(text, dictionary):
    """np.bincount of the ids of a tokenised text, one EOS a line (what
    fairseq-preprocess binarises), float64."""
    ids = []
    for line in text.read_text(encoding="utf-8").splitlines():
        ids += [dictionary.index(word) for word in line.split()] + [dictionary.eos()]
    return np.bincount(ids, minlength=len(dictionary)).astype(np.float64)


@pytest.mark.training
def test_gain_init_sets_the_saved_gain_and_the_bits_at_update_0(toy_bin, toy_text, tmp_path):
    """docs/options.md: ``--natbias-gain-init 0.02`` for d >= 2048. The first
    update is taken at learning rate 0 (inverse_sqrt's warm-up starts from
    --warmup-init-lr 0), so the checkpoint holds the model as initialised and
    the validation after it is update 0's."""
    from fairseq.data import Dictionary

    gain_init = 0.02
    result = train(
        toy_bin, tmp_path, "--natbias-gain-init", gain_init, "--warmup-init-lr", "0",
        max_update=1,
    )  # fmt: skip
    state = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu")
    weights, cfg = state["model"], state["cfg"]["model"]
    # the gain as docs/options.md defines it: g = min(|C u|, 1), C the gain speed
    u = weights["decoder.output_projection.gain_param"].double().item()
    gain = min(abs(cfg.natbias_gain_speed * u), 1.0)
    assert gain == pytest.approx(gain_init, rel=1e-6)  # u in float32: 2^-24 relative

    # The unigram's cross-entropy on the validation targets, counted here
    # (add-1, --natbias-smoothing's default, over the target dictionary).
    dictionary = Dictionary.load(str(toy_bin / "dict.tgt.txt"))
    train_counts = hand_counts(toy_text / "train.tgt", dictionary)
    log_u = np.log((train_counts + 1) / (train_counts.sum() + len(dictionary)))
    valid = hand_counts(toy_text / "valid.tgt", dictionary)
    unigram_bits = -(valid @ log_u) / valid.sum() / LN2
    # The logits are b + g z with z = W phi and b = log_u. Per token,
    # |log softmax(b + g z)_y - log softmax(b)_y| <= |g z_y| + max_i |g z_i|
    # <= 2 g max_i |z_i|, and |z_i| <= ||W_i|| ||phi||. phi is the last
    # decoder layer's final LayerNorm (post-norm), gamma * x_hat + beta with
    # ||x_hat|| <= sqrt(d), so ||phi|| <= max|gamma| sqrt(d) + ||beta||.
    w = weights["decoder.output_projection.weight"].double()
    layers = cfg.decoder_layers
    gamma = weights[f"decoder.layers.{layers - 1}.final_layer_norm.weight"].double()
    beta = weights[f"decoder.layers.{layers - 1}.final_layer_norm.bias"].double()
    phi_norm = gamma.abs().max() * math.sqrt(w.shape[1]) + beta.norm()
    bound_bits = 2 * gain * (w.norm(dim=1).max() * phi_norm).item() / LN2
    (validation,) = log_records(result.stdout, "valid")
    assert abs(validation["nll_loss"] - unigram_bits) <= bound_bits + 5e-4, (
        validation,
        unigram_bits,
        bound_bits,
    )  # 5e-4: the log's 3 decimals
    assert bound_bits < 1.0  # the bound says something: the zero bias starts > 3 bits off
