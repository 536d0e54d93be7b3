"""examples/paper/decomposition.py: eq. (4) made exact,
log p(y) = log p_Wphi(y) + log p_b(y) + normaliser, on real fairseq models
(translation and language model, with and without a bias), each term checked
against a computation that does not go through the module: the decoder's
features through g W by hand, log_softmax(b), beam search's own scores."""

import math

import decomposition
import pytest
import torch
from natbias_testing import TINY_LM, TINY_MODEL, train, train_lm

from fairseq_natbias.in_process import build_from_training_args
from natbias.errors import NaturalBiasError

IDENTITY_TOLERANCE = 1e-5
# The trained models: (kind, --natbias-init).
MODELS = [
    ("translation", "unigram"),
    ("translation", "none"),
    ("language_model", "unigram"),
    ("language_model", "none"),
]
MODEL_IDS = [f"{kind}-{init}" for kind, init in MODELS]


@pytest.fixture(scope="module")
def checkpoints(toy_bin, toy_lm_bin, tmp_path_factory):
    """Tiny models trained 4 updates by the real fairseq-train, two at a time."""
    root = tmp_path_factory.mktemp("decomposition_models")

    def run(model):
        kind, init = model
        save_dir = root / f"{kind}-{init}"
        if kind == "translation":
            train(toy_bin, save_dir, "--natbias-init", init, max_update=4)
        else:
            train_lm(toy_lm_bin, save_dir, "--natbias-init", init, max_update=4)
        return save_dir / "checkpoint_last.pt"

    return {model: run(model) for model in MODELS}


@pytest.fixture(scope="module")
def hubs(checkpoints, toy_bin, toy_lm_bin):
    data = {"translation": toy_bin, "language_model": toy_lm_bin}
    return {
        model: decomposition.load_model(str(path), str(data[model[0]]))
        for model, path in checkpoints.items()
    }


def sentences(hub, toy_text, kind, n=6):
    """``(target ids, source ids or None)`` of the first validation sentences."""
    side = "src" if kind == "translation" else "tgt"
    sources = (toy_text / f"valid.{side}").read_text().splitlines()[:n]
    targets = (toy_text / "valid.tgt").read_text().splitlines()[:n]
    pairs = []
    for source, target in zip(sources, targets):
        target_ids = hub.tgt_dict.encode_line(target, add_if_not_exist=False).long()
        pairs.append((target_ids, hub.encode(source) if kind == "translation" else None))
    return pairs


def context_logits(model, target, source):
    """g W phi in float64, from the decoder's features phi through the
    head's W and g by hand (not through the head's forward)."""
    eos = model.decoder.dictionary.eos()
    shifted = torch.cat([target.new_tensor([eos]), target[:-1]]).unsqueeze(0)
    with torch.no_grad():
        if source is None:
            phi, _ = model.decoder(shifted, features_only=True)
        else:
            encoder_out = model.encoder(
                source.unsqueeze(0), src_lengths=torch.tensor([len(source)])
            )
            phi, _ = model.decoder(shifted, encoder_out=encoder_out, features_only=True)
    projection = model.decoder.output_projection
    gain = projection.gain() if hasattr(projection, "gain") else None
    gain = 1.0 if gain is None else gain.double()  # None: fairseq's W, no gain
    return gain * phi[0].double() @ projection.weight.double().T


def hand_terms(model, target, source):
    """float64, from the decoder's features phi: g W phi by hand, then the
    three log-softmaxes and the normaliser as written in eq. (4)."""
    projection = model.decoder.output_projection
    logits = context_logits(model, target, source)
    positions = torch.arange(len(target))
    log_p_context = torch.log_softmax(logits, -1)
    if projection.bias is None:
        picked = log_p_context[positions, target]
        return {"log_p": picked, "context": picked}
    bias = projection.bias.detach().double()
    log_p_bias = torch.log_softmax(bias, -1)
    full = torch.log_softmax(logits + bias, -1)
    normaliser = -torch.log((log_p_context.exp() * log_p_bias.exp()).sum(-1))
    return {
        "log_p": full[positions, target],
        "context": log_p_context[positions, target],
        "frequency": log_p_bias[target],
        "normaliser": normaliser,
    }


# --- the identity and each term, on trained models --------------------------------------


@pytest.mark.parametrize("model_key", MODELS, ids=MODEL_IDS)
@pytest.mark.training
def test_terms_sum_to_log_p_and_match_a_hand_computation(hubs, toy_text, model_key):
    hub = hubs[model_key]
    model = hub.models[0]
    for target, source in sentences(hub, toy_text, model_key[0]):
        result = decomposition.decompose(model, target, source)
        assert result.log_p.dtype == torch.float32 and len(result.log_p) == len(target)
        assert result.residual().abs().max() < IDENTITY_TOLERANCE
        expected = hand_terms(model, target, source)
        for name, values in expected.items():
            torch.testing.assert_close(
                getattr(result, name).double(), values, atol=2e-5, rtol=0, msg=name
            )
        assert torch.equal(result.tokens, target)
        assert result.symbols == [hub.tgt_dict[int(i)] for i in target]


@pytest.mark.parametrize(
    "model_key",
    [m for m in MODELS if m[1] == "unigram"],
    ids=[i for i in MODEL_IDS if i.endswith("unigram")],
)
@pytest.mark.training
def test_with_a_bias_the_terms_behave_as_eq_4_says(hubs, toy_text, model_key):
    """The frequency term varies by token (b is not uniform); the normaliser
    is >= 0 (sum_v p_Wphi(v) p_b(v) <= 1)."""
    hub = hubs[model_key]
    target, source = sentences(hub, toy_text, model_key[0])[0]
    result = decomposition.decompose(hub.models[0], target, source)
    assert result.has_bias and result.note is None and result.gain is not None
    assert (result.normaliser >= 0).all()
    assert result.frequency.max() - result.frequency.min() > 0.5


@pytest.mark.parametrize("kind", ["translation", "language_model"])
@pytest.mark.training
def test_without_a_bias_the_context_is_everything(hubs, toy_text, kind):
    hub = hubs[kind, "none"]
    assert hub.models[0].decoder.output_projection.bias is None
    target, source = sentences(hub, toy_text, kind)[0]
    result = decomposition.decompose(hub.models[0], target, source)
    assert not result.has_bias and "no output bias" in result.note
    assert torch.count_nonzero(result.frequency) == 0
    assert torch.count_nonzero(result.normaliser) == 0
    assert torch.equal(result.log_p, result.context)
    assert "note: the model has no output bias" in result.format_table()


@pytest.mark.training
def test_log_p_is_what_beam_search_scored(hubs, toy_text):
    """A beam-5 translation's positional scores (fairseq's incremental
    decoding, a different code path) are the decomposition's log p."""
    hub = hubs["translation", "unigram"]
    for _, source in sentences(hub, toy_text, "translation", n=3):
        best = hub.generate(source, beam=5, max_len_b=12)[0]
        result = decomposition.decompose(hub.models[0], best["tokens"], source)
        torch.testing.assert_close(
            result.log_p, best["positional_scores"].float(), atol=1e-4, rtol=0
        )


@pytest.mark.training
def test_table_rows_are_the_terms(hubs, toy_text):
    hub = hubs["language_model", "unigram"]
    target, _ = sentences(hub, toy_text, "language_model")[1]
    result = decomposition.decompose(hub.models[0], target)
    lines = result.format_table().splitlines()
    assert lines[0].split() == ["t", "token", "log_p", "context", "frequency", "normaliser"]
    body = [line.split() for line in lines[1 : 1 + len(target)]]
    for row, t in zip(body, range(len(target))):
        assert row[1] == hub.tgt_dict[int(target[t])]
        values = [float(v) for v in row[2:]]
        assert values[0] == pytest.approx(float(result.log_p[t]), abs=5e-5)
        assert values[0] == pytest.approx(sum(values[1:]), abs=2e-4)  # 4-decimal rounding
    sums = [float(v) for v in lines[1 + len(target)].split()[1:]]
    assert sums[0] == pytest.approx(float(result.log_p.sum()), abs=1e-3)


# --- a fresh model: the bias does the predicting --------------------------------------


def fresh_model(kind, data, *options):
    if kind == "translation":
        argv = [str(data), "--arch", "transformer_natbias", *TINY_MODEL]
    else:
        argv = [
            str(data),
            "--arch",
            "transformer_lm_natbias",
            *TINY_LM,
            "--task",
            "language_modeling",
            "--tokens-per-sample",
            "32",
        ]
    argv += [
        "--user-dir",
        "fairseq_natbias",
        "--cpu",
        "--seed",
        "1",
        "--save-dir",
        "/nonexistent/ckpt",
        *options,
    ]
    _, task, model = build_from_training_args(argv)
    return task, model.eval()


def fresh_gaps(kind, data, toy_text, *options):
    """Per token of 6 validation sentences: |log p - frequency term|,
    |context + log V| and |normaliser - log V| (each 0 when p_Wphi is
    uniform), and the spread max_v - min_v of g W phi at the token's
    position, computed by hand (context_logits); V."""
    task, model = fresh_model(kind, data, *options)
    vocab = len(task.target_dictionary)
    side = "src" if kind == "translation" else "tgt"
    sources = (toy_text / f"valid.{side}").read_text().splitlines()[:6]
    targets = (toy_text / "valid.tgt").read_text().splitlines()[:6]
    gaps = {"to_frequency": [], "from_uniform": [], "normaliser": [], "spread": []}
    for source, target in zip(sources, targets):
        target_ids = task.target_dictionary.encode_line(target, add_if_not_exist=False).long()
        source_ids = (
            task.source_dictionary.encode_line(source, add_if_not_exist=False).long()
            if kind == "translation"
            else None
        )
        result = decomposition.decompose(model, target_ids, source_ids)
        assert result.residual().abs().max() < IDENTITY_TOLERANCE
        logits = context_logits(model, target_ids, source_ids)
        gaps["to_frequency"].append((result.log_p - result.frequency).abs().double())
        gaps["from_uniform"].append((result.context + math.log(vocab)).abs().double())
        gaps["normaliser"].append((result.normaliser - math.log(vocab)).abs().double())
        gaps["spread"].append(logits.max(-1).values - logits.min(-1).values)
    return {name: torch.cat(values) for name, values in gaps.items()}, vocab


# Why a small gain makes log p the frequency term, with c = g W phi at a
# position and r = max_v c_v - min_v c_v its spread (eq. 4's terms):
#   log p(y) - log p_b(y) = c_y - log sum_v p_b(v) e^{c_v}, in [c_y - max c, c_y - min c];
#   log p_Wphi(y) + log V = c_y - logsumexp(c) + log V, in [c_y - max c, c_y - mean c];
#   normaliser - log V = -log sum_v p_b(v) V p_Wphi(v), each V p_Wphi(v) in [e^-r, e^r].
# So each gap is at most r, exactly; float32's rounding of the three terms
# adds at most IDENTITY_TOLERANCE. And r is at most 2 g max_v |w_v . phi|,
# where fairseq draws W's entries N(0, 1/d) and phi leaves a LayerNorm
# (|phi| = sqrt(d)): each w_v . phi is N(0, 1), and the largest |N(0, 1)| of
# n draws exceeds sqrt(2 ln(2 n / delta)) with probability below delta (the
# union bound), here n = V x the tokens and delta = 1e-6.
UNLIKELY = 1e-6


@pytest.mark.parametrize("kind", ["translation", "language_model"])
def test_a_fresh_default_model_is_its_frequency_term(toy_bin, toy_lm_bin, toy_text, kind):
    """Default gain 0.05: p_Wphi is nearly uniform (context ~ -log V,
    normaliser ~ log V), so log p ~ log p_b for every token (Fig. 1 at update
    0), within the spread of g W phi, which the gain makes small. fairseq's
    own W (no gain) spreads g W phi 1/g = 20 times as far (the same W and
    phi: the same seed), and moves log p away from log p_b by more."""
    data = toy_bin if kind == "translation" else toy_lm_bin
    gaps, vocab = fresh_gaps(kind, data, toy_text)
    gain = gain_of(kind, data)
    assert gain == pytest.approx(0.05)
    for name in ("to_frequency", "from_uniform", "normaliser"):
        assert (gaps[name] <= gaps["spread"] + IDENTITY_TOLERANCE).all(), name
    largest_draw = math.sqrt(2 * math.log(2 * vocab * len(gaps["spread"]) / UNLIKELY))
    assert gaps["spread"].max() <= 2 * gain * largest_draw
    stock, _ = fresh_gaps(kind, data, toy_text, "--natbias-weight-init", "fairseq")
    torch.testing.assert_close(stock["spread"], gaps["spread"] / gain, rtol=1e-5, atol=0)
    assert stock["spread"].max() > 2 * gain * largest_draw  # the control: the bound can fail
    assert stock["to_frequency"].mean() > gaps["to_frequency"].mean()


def gain_of(kind, data):
    return float(fresh_model(kind, data)[1].decoder.output_projection.gain().detach())


# --- the identity on logits alone ---------------------------------------------------------


def test_closed_form_when_the_context_is_uniform():
    """g W phi = 0: p = p_b, context = -log V, normaliser = log V."""
    probs = torch.tensor([0.5, 0.3, 0.2])
    bias = probs.log() + 7.0  # softmax ignores the shift
    terms = decomposition.decompose_logits(bias.unsqueeze(0), bias, torch.tensor([1]))
    assert terms.log_p.item() == pytest.approx(math.log(0.3), abs=1e-6)
    assert terms.context.item() == pytest.approx(-math.log(3), abs=1e-6)
    assert terms.frequency.item() == pytest.approx(math.log(0.3), abs=1e-6)
    assert terms.normaliser.item() == pytest.approx(math.log(3), abs=1e-6)


def test_batched_half_precision_logits_are_decomposed_in_float32():
    torch.manual_seed(0)
    vocab = 50
    bias = torch.randn(vocab) * 3
    context = torch.randn(2, 5, vocab) * 4
    target = torch.randint(vocab, (2, 5))
    terms = decomposition.decompose_logits((context + bias).half(), bias.half(), target)
    assert all(t.dtype == torch.float32 and t.shape == (2, 5) for t in terms)
    residual = terms.log_p - terms.context - terms.frequency - terms.normaliser
    assert residual.abs().max() < IDENTITY_TOLERANCE
    logits = (context + bias).half().double()
    expected_full = torch.log_softmax(logits, -1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(terms.log_p.double(), expected_full, atol=1e-5, rtol=0)
    expected_frequency = torch.log_softmax(bias.half().double(), -1)[target]
    torch.testing.assert_close(terms.frequency.double(), expected_frequency, atol=1e-5, rtol=0)


# --- bad input: one NaturalBiasError naming the fix ----------------------------------------------


def test_a_missing_checkpoint_is_named(tmp_path, toy_bin):
    with pytest.raises(NaturalBiasError, match="no such checkpoint"):
        decomposition.load_model(str(tmp_path / "nothing.pt"), str(toy_bin))
    with pytest.raises(NaturalBiasError, match="is a directory"):
        decomposition.load_model(str(tmp_path), str(toy_bin))


def test_a_file_that_is_not_a_checkpoint_is_named(toy_bin):
    with pytest.raises(NaturalBiasError, match="is not a fairseq checkpoint"):
        decomposition.load_model(str(toy_bin / "dict.tgt.txt"), str(toy_bin))


@pytest.mark.training
def test_a_checkpoint_of_another_model_is_refused(checkpoints, toy_bin, tmp_path):
    state = torch.load(checkpoints["translation", "none"], map_location="cpu")
    state["cfg"]["model"].arch = "transformer"
    stock = tmp_path / "stock.pt"
    torch.save(state, stock)
    with pytest.raises(NaturalBiasError, match="--arch transformer, not a fairseq_natbias model"):
        decomposition.load_model(str(stock), str(toy_bin))


@pytest.mark.training
def test_wrong_data_directory_is_named(checkpoints, toy_bin, tmp_path):
    with pytest.raises(NaturalBiasError, match="no such data directory"):
        decomposition.load_model(str(checkpoints["translation", "unigram"]), str(tmp_path / "x"))
    with pytest.raises(NaturalBiasError, match="data directory the model was trained on"):
        decomposition.load_model(str(checkpoints["language_model", "unigram"]), str(toy_bin))


@pytest.mark.training
def test_missing_sentencepiece_model_is_named(checkpoints, toy_bin, tmp_path):
    with pytest.raises(NaturalBiasError, match="no such SentencePiece model"):
        decomposition.load_model(
            str(checkpoints["translation", "unigram"]),
            str(toy_bin),
            sentencepiece_model=str(tmp_path / "spm.model"),
        )


@pytest.mark.training
def test_inputs_that_do_not_fit_the_model_are_refused(hubs, toy_text):
    translation = hubs["translation", "unigram"]
    target, source = sentences(translation, toy_text, "translation")[0]
    with pytest.raises(NaturalBiasError, match="needs the source"):
        decomposition.decompose(translation.models[0], target)
    with pytest.raises(NaturalBiasError, match="vocabulary has"):
        decomposition.decompose(translation.models[0], target + 10_000, source)
    language_model = hubs["language_model", "unigram"]
    with pytest.raises(NaturalBiasError, match="has no source"):
        decomposition.decompose(language_model.models[0], target, source)
