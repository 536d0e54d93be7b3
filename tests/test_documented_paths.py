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


# Beam size and length limit as a user would give them to both routes.
BEAM, MAX_LEN_B = 5, 12


def generated_hypotheses(stdout):
    """fairseq-generate's S- and H- lines: sentence id -> (source, score, hypothesis)."""
    sources, hypotheses = {}, {}
    for line in stdout.splitlines():
        if line.startswith("S-"):
            name, text = line.split("\t")
            sources[int(name[2:])] = text
        elif line.startswith("H-"):
            name, score, text = line.split("\t")
            hypotheses[int(name[2:])] = (float(score), text)
    return {i: (sources[i], *hypotheses[i]) for i in hypotheses}


@pytest.mark.training
def test_the_hubs_from_pretrained_translates_as_fairseq_generate(toy_bin, toy_text, tmp_path):
    """docs/checkpoints.md's hub snippet (without SentencePiece: the toy text is
    words) on a checkpoint of fairseq-train, with a generation-time key, against
    fairseq-generate on the same sentences, one a batch, same beam and key: the
    same tokens, and their scores alike to the printed precision. (Without
    --required-batch-size-multiple 1, fairseq-generate --batch-size 1 prints
    19 of the 20 sentences here, 18 with --batch-size 2: fairseq 0.12's.) The gain
    starts at 0.5 so that W phi (context) and lambda b both move the output."""
    from natbias_testing import NO_LOADER_PROCESS, fairseq

    from fairseq_natbias.transformer_natbias import TransformerNatbiasModel

    train(toy_bin, tmp_path, "--natbias-gain-init", "0.5", max_update=8)
    generate = fairseq(
        "fairseq-generate", *NO_LOADER_PROCESS, toy_bin, "--path", tmp_path / "checkpoint_last.pt",
        "--user-dir", "fairseq_natbias", "--beam", BEAM, "--max-len-b", MAX_LEN_B,
        "--batch-size", "1", "--required-batch-size-multiple", "1", "--model-overrides", "{'natbias_bias_scale': 0.5}",
    )  # fmt: skip
    expected = generated_hypotheses(generate.stdout)
    sources = (toy_text / "test.src").read_text(encoding="utf-8").splitlines()
    assert sorted(expected) == list(range(len(sources)))

    def hub(**overrides):
        return TransformerNatbiasModel.from_pretrained(
            str(tmp_path), "checkpoint_last.pt", data_name_or_path=str(toy_bin), **overrides
        ).eval()

    scaled, plain = hub(natbias_bias_scale=0.5), hub()
    options = dict(beam=BEAM, max_len_b=MAX_LEN_B)
    for i, source in enumerate(sources):
        (best,) = scaled.generate([scaled.encode(source)], **options)[0][:1]
        printed_source, score, text = expected[i]
        assert printed_source == source
        assert scaled.translate(source, **options) == text, (i, source)
        assert scaled.string(best["tokens"]) == text
        # fairseq-generate prints score / ln 2 in full float32 (~2^-24 relative)
        assert best["score"].item() / LN2 == pytest.approx(score, rel=1e-6)
    # The key acts, and the model reads its source: else equal tokens prove little.
    translations = [plain.translate(source, **options) for source in sources]
    assert sum(t != expected[i][2] for i, t in enumerate(translations)) >= len(sources) // 4
    assert len({text for _, _, text in expected.values()}) >= len(sources) // 2
