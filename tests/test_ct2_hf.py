"""natbias-ct2-converter on natbias.hf models (natbias.hf.ct2): each family that
CTranslate2 converts, tiny and built in code (tests/hf_tiny.py), is served
with the same scores and greedily the same tokens as transformers gives it
(a row may part only at a tie within the scores' agreement); with b zeroed
in the converted model they differ in at least 10 % of the rows (the control). A family
CTranslate2 cannot convert, stock or not, is refused in one line."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
ctranslate2 = pytest.importorskip("ctranslate2")
from ctranslate2.converters import transformers as ct2_transformers  # noqa: E402
from hf_tiny import FAMILIES, V, build, is_seq2seq, zipf_targets  # noqa: E402

from natbias.ct2_converter import main  # noqa: E402
from natbias.errors import NaturalBiasError  # noqa: E402
from natbias.hf import add_natural_bias, to_ctranslate2  # noqa: E402

# Settings as the hub's models of these families have them, which CTranslate2's
# loaders assume and the configurations built in code lack: facebook/bart-large's
# post-norm, mBART's and Pegasus's pre-norm, Pegasus's plain embeddings;
# Marian's vocabulary ending in <pad>, its decoder's start, as Opus-MT's
# (CTranslate2 drops that row and starts from a zero embedding); M2M100's
# special ids, whose positions start after <pad> = 1; and a Gemma 2 that
# CTranslate2 serves exactly, as Gemma 2 2B and 9B but without attention soft
# capping (tested apart: refused). Gemma 2's logits keep their soft cap.
HUB_SETTINGS = {
    "bart": dict(normalize_before=False),
    "mbart": dict(normalize_before=True),
    "pegasus": dict(normalize_before=True, normalize_embedding=False),
    "marian": dict(pad_token_id=V - 1, decoder_start_token_id=V - 1),
    "m2m_100": dict(bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2),
    "gemma2": dict(query_pre_attn_scalar=8, attn_logit_softcapping=None),
}
PROMPTS = torch.randint(4, V - 1, (6, 5), generator=torch.Generator().manual_seed(3)).tolist()
STEPS = 8


def word_tokenizer(config):
    """A word-level tokenizer over the model's V ids (w4, w5, ...), its
    special tokens where the configuration puts them."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    names = {config.pad_token_id: "<pad>", config.eos_token_id: "</s>", 3: "<unk>"}
    if isinstance(getattr(config, "bos_token_id", None), int):
        names.setdefault(config.bos_token_id, "<s>")
    vocabulary = {names.get(i, f"w{i}"): i for i in range(V)}
    special = dict(pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    if "<s>" in vocabulary:
        special["bos_token"] = "<s>"
    word_level = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=word_level, **special)


def stock_model(family, **settings):
    model = build(family, **{**HUB_SETTINGS.get(family, {}), **settings}).eval()
    if getattr(model.config, "pad_token_id", None) is None:  # GPT-2's, CodeGen's
        model.config.pad_token_id = 0
    model.generation_config.forced_eos_token_id = None  # CTranslate2 forces none
    return model


def natural_bias_model(family, **settings):
    """A natural-bias model whose greedy output depends on all of W phi, g and
    b: W scaled so that g W phi spreads the logits by about 2, g = 0.4, b
    moved off the prior (by N(0, 2^2)) as training moves it."""
    model = add_natural_bias(stock_model(family, **settings), zipf_targets()).eval()
    head = model.get_output_embeddings()
    with torch.no_grad():
        head.gain_param.fill_(0.4 / head.gain_speed)
        bias = model.output_bias()
        bias.zero_()
        head.weight.mul_(2.0 / teacher_forced_logits(model, PROMPTS).std())
        bias.copy_(2.0 * torch.randn(V, generator=torch.Generator().manual_seed(1)))
    return model


def teacher_forced_logits(model, sequences):
    ids = torch.tensor(sequences)
    with torch.no_grad():
        if is_seq2seq(model):
            start = torch.full((len(sequences), 1), model.config.decoder_start_token_id)
            return model(input_ids=ids, decoder_input_ids=torch.cat([start, ids], 1)).logits
        return model(input_ids=ids).logits


def transformers_scores(model, sequences, served_size=V):
    """log p of each sequence's tokens: the decoder's whole sequence given
    itself as the source (sequence to sequence), else all but the first;
    normalised over the first ``served_size`` entries, those CTranslate2 serves."""
    logits = teacher_forced_logits(model, sequences)[..., :served_size]
    log_p = torch.log_softmax(logits.double(), -1)
    ids = torch.tensor(sequences)
    if not is_seq2seq(model):
        log_p, ids = log_p[:, :-1], ids[:, 1:]
    else:
        log_p = log_p[:, :-1]  # the last position predicts past the sequence
    return log_p.gather(-1, ids.unsqueeze(-1)).squeeze(-1)


# A sequence-to-sequence decoder continues the first tokens of its source: a
# tiny random model's cross-attention alone barely tells one source from another.
DECODER_PREFIX = 2


def transformers_greedy(model):
    options = {}
    if is_seq2seq(model):
        start = torch.full((len(PROMPTS), 1), model.config.decoder_start_token_id)
        prefix = torch.tensor(PROMPTS)[:, :DECODER_PREFIX]
        options["decoder_input_ids"] = torch.cat([start, prefix], 1)
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor(PROMPTS),
            do_sample=False,
            num_beams=1,
            max_new_tokens=STEPS,
            pad_token_id=model.config.pad_token_id,
            **options,
        ).tolist()
    skip = 1 + DECODER_PREFIX if is_seq2seq(model) else len(PROMPTS[0])
    return [until_eos(ids[skip:], model.config.eos_token_id) for ids in out]


# CTranslate2's log p against transformers' (float32 both): each engine's
# forward sums in its own order, and a sum of n terms moves by at most
# n u sum|terms| (Higham's gamma_n, u = 2^-24). In these one-layer models the
# longest sums have 64 terms (GPT-2's feed-forward; 32 in the others) and a
# token's log p passes through at most 16 sums (tests/test_checkpoints.py
# counts them), each term of about the result's size: 16 x 64 u of |log p| per
# engine, twice that between the two. So a log p may differ by this share of
# its size, and a greedy step whose top-2 log p are closer than their two
# margins together is a tie that CTranslate2 may break the other way: its row
# may differ from there on, and only from there.
FLOAT32_RELATIVE = 2 * 16 * 64 * 2.0**-24
CHANGED = 0.1  # the control (b zeroed) changes at least this share of the rows


def step_gap(model, prompt, prefix, size=V):
    """transformers' top-2 gap of log p at the greedy step after ``prefix``
    (over the first ``size`` entries, those CTranslate2 serves)."""
    with torch.no_grad():
        if is_seq2seq(model):
            start = [model.config.decoder_start_token_id, *prompt[:DECODER_PREFIX], *prefix]
            inputs = dict(input_ids=torch.tensor([prompt]), decoder_input_ids=torch.tensor([start]))
        else:
            inputs = dict(input_ids=torch.tensor([prompt + prefix]))
        logits = model(**inputs).logits[0, -1, :size]
    top = torch.log_softmax(logits.double(), -1).topk(2).values
    return (top[0] - top[1]).item(), FLOAT32_RELATIVE * top.abs().sum().item()


def assert_same_greedy(model, greedy, expected, size=V):
    """Each row transformers', or parting from it only at a tie (FLOAT32_RELATIVE)."""
    for i, (row, reference) in enumerate(zip(greedy, expected, strict=True)):
        if row == reference:
            continue
        step = next((s for s, (a, b) in enumerate(zip(row, reference)) if a != b), None)
        step = min(len(row), len(reference)) if step is None else step
        gap, tie = step_gap(model, PROMPTS[i], reference[:step], size)
        assert gap <= tie, f"row {i} differs at step {step}, where the top-2 gap is {gap:.2e}"


def changed_share(greedy, expected):
    return sum(a != b for a, b in zip(greedy, expected, strict=True)) / len(expected)


def until_eos(ids, eos):
    return ids[: ids.index(eos)] if eos in ids else ids


def served(model, tokenizer, directory):
    """(scores, greedy ids) of the CTranslate2 model in ``directory``."""
    tokens = [tokenizer.convert_ids_to_tokens(p) for p in PROMPTS]
    if is_seq2seq(model):
        translator = ctranslate2.Translator(str(directory), intra_threads=1)
        start = [tokenizer.convert_ids_to_tokens(model.config.decoder_start_token_id)]
        start = start if needs_start(directory) else []
        scored = translator.score_batch(tokens, [start + t for t in tokens])
        scores = [s.log_probs[:-1] for s in scored]  # the last: end of sequence
        skip = len(start) + DECODER_PREFIX
        results = translator.translate_batch(
            tokens,
            target_prefix=[start + t[:DECODER_PREFIX] for t in tokens],
            beam_size=1,
            max_decoding_length=STEPS + skip,
        )
        greedy = [r.hypotheses[0][skip:] for r in results]
    else:
        generator = ctranslate2.Generator(str(directory), intra_threads=1)
        scores = [s.log_probs for s in generator.score_batch(tokens)]
        results = generator.generate_batch(
            tokens, max_length=STEPS, sampling_topk=1, include_prompt_in_result=False
        )
        greedy = [r.sequences[0] for r in results]
    ids = [tokenizer.convert_tokens_to_ids(g) for g in greedy]
    return torch.tensor(scores, dtype=torch.float64), ids


def served_size(directory):
    """How many vocabulary entries the CTranslate2 model serves (Marian's: all but <pad>)."""
    import json

    names = ("target_vocabulary.json", "shared_vocabulary.json", "vocabulary.json")
    (path,) = [directory / name for name in names if (directory / name).exists()]
    return len(json.loads(path.read_text()))


def needs_start(directory):
    """mBART's decoder start is given by the caller (a language code) in CTranslate2."""
    import json

    return (directory / "config.json").exists() and json.loads(
        (directory / "config.json").read_text()
    ).get("decoder_start_token") in (None, "")


def stock_converts(family, tokenizer):
    """Whether CTranslate2's loader reads the stock model of the family at all."""
    model = stock_model(family)
    loader = ct2_transformers._MODEL_LOADERS.get(type(model.config).__name__)
    if loader is None:
        return False
    try:
        with torch.no_grad():
            loader(model, tokenizer)
    except (AttributeError, KeyError, ValueError, NotImplementedError):
        return False
    return True


@pytest.fixture(scope="module")
def converted():
    """The families whose stock model CTranslate2's loader reads."""
    return {f for f in FAMILIES if stock_converts(f, word_tokenizer(stock_model(f).config))}


@pytest.mark.engine
def test_the_families_served_include_the_large_language_models_and_translation_models(converted):
    """So that the test below checks serving, not only refusals: the families
    issue 89 names that CTranslate2 converts here (GPT-NeoX's loader reads
    rotary_pct, which transformers 5 no longer keeps: refused)."""
    named = {"llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gpt2", "opt", "t5"}
    assert named | {"marian", "bart"} <= converted
    assert "gpt_neox" not in converted and "cohere" not in converted


@pytest.mark.engine
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_ctranslate2_converts_is_served_with_the_natural_bias(
    family, converted, tmp_path
):
    model = natural_bias_model(family)
    tokenizer = word_tokenizer(model.config)
    if family not in converted:
        with pytest.raises(NaturalBiasError) as refusal:
            to_ctranslate2(model, tmp_path / "ct2", tokenizer)
        message = str(refusal.value)
        assert "CTranslate2" in message and "\n" not in message, message
        return
    expected = transformers_greedy(model)
    assert len({tuple(ids) for ids in expected}) > 1  # the prompts lead to different outputs
    directory = to_ctranslate2(model, tmp_path / "ct2", tokenizer)
    scores, greedy = served(model, tokenizer, directory)
    expected_scores = transformers_scores(model, PROMPTS, served_size(directory))
    margin = FLOAT32_RELATIVE * expected_scores.abs().max().item()  # the largest |log p|'s
    assert (scores - expected_scores).abs().max().item() <= margin
    assert_same_greedy(model, greedy, expected, served_size(directory))
    assert model.get_output_embeddings().gain().item() == pytest.approx(0.4)  # left as it was

    zeroed = copy.deepcopy(model)
    with torch.no_grad():
        zeroed.output_bias().zero_()
    scores, greedy = served(model, tokenizer, to_ctranslate2(zeroed, tmp_path / "zero", tokenizer))
    assert (scores - expected_scores).abs().max().item() > 0.1
    assert changed_share(greedy, expected) >= CHANGED, (greedy, expected)


def test_gemma_2_with_attention_soft_capping_is_refused_as_inexact(tmp_path):
    """CTranslate2's Gemma2 loader drops attn_logit_softcapping (for the stock
    model too): the scores of such a model would differ from transformers'."""
    model = natural_bias_model("gemma2", attn_logit_softcapping=50.0)
    with pytest.raises(NaturalBiasError) as refusal:
        to_ctranslate2(model, tmp_path / "ct2", word_tokenizer(model.config))
    assert "attn_logit_softcapping 50" in str(refusal.value) and "\n" not in str(refusal.value)
    assert not (tmp_path / "ct2").exists()


@pytest.mark.engine
def test_the_console_script_converts_a_saved_model_and_quantizes_it(tmp_path, capsys):
    model = natural_bias_model("llama")
    tokenizer = word_tokenizer(model.config)
    model.save_pretrained(tmp_path / "saved")
    tokenizer.save_pretrained(tmp_path / "saved")
    for quantization in ("float32", "int8"):
        main(
            ["--model", str(tmp_path / "saved"), "--output_dir", str(tmp_path / quantization)]
            + ["--quantization", quantization]
        )
        assert f"wrote {tmp_path / quantization}" in capsys.readouterr().out
    _, greedy = served(model, tokenizer, tmp_path / "float32")
    assert_same_greedy(model, greedy, transformers_greedy(model))
    sizes = {q: (tmp_path / q / "model.bin").stat().st_size for q in ("float32", "int8")}
    assert sizes["int8"] < 0.6 * sizes["float32"]  # the weights stored in a byte, not four
    generator = ctranslate2.Generator(str(tmp_path / "int8"), compute_type="int8", intra_threads=1)
    assert generator.generate_batch([["<s>", "w5"]], max_length=3)[0].sequences_ids[0]


def test_a_model_without_the_natural_bias_is_refused_in_one_line(tmp_path, capsys):
    stock = stock_model("llama")
    stock.save_pretrained(tmp_path / "stock")
    word_tokenizer(stock.config).save_pretrained(tmp_path / "stock")
    with pytest.raises(SystemExit) as stop:
        main(["--model", str(tmp_path / "stock"), "--output_dir", str(tmp_path / "ct2")])
    assert str(stop.value).startswith("natbias-ct2-converter: error: LlamaConfig records no")
    assert "\n" not in str(stop.value)
    with pytest.raises(NaturalBiasError, match="has no natural bias"):
        to_ctranslate2(stock, tmp_path / "ct2", word_tokenizer(stock.config))
    with pytest.raises(NaturalBiasError, match="give the model's tokenizer"):
        to_ctranslate2(natural_bias_model("llama"), tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists()


@pytest.mark.parametrize(
    "arguments, said",
    [
        (["--model", "{empty}"], "holds no config.json"),
        (["--model_path", "{empty}/checkpoint.pt"], "no such checkpoint file"),
        (["--model", "{empty}", "--output_dir", "{empty}"], "exists: give --force to replace it"),
    ],
)
def test_the_console_script_says_what_is_wrong_with_a_path_in_one_line(arguments, said, tmp_path):
    (tmp_path / "empty").mkdir()
    arguments = [a.format(empty=tmp_path / "empty") for a in arguments]
    if "--output_dir" not in arguments:
        arguments += ["--output_dir", str(tmp_path / "ct2")]
    with pytest.raises(SystemExit) as stop:
        main(arguments)
    assert str(stop.value).startswith("natbias-ct2-converter: error: ")
    assert said in str(stop.value) and "\n" not in str(stop.value)
