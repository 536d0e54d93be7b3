"""natbias.hf.to_stock: a natural-bias model as its stock transformers class
with the same logits, saved and reloaded as a stock model, and served by
CTranslate2 (a Marian trained on a Multi30k slice)."""

import gzip
import itertools
import logging

import pytest
import torch

transformers = pytest.importorskip("transformers")
from hf_tiny import FAMILIES, SLOTS, V, build, inputs_for, is_seq2seq, zipf_targets  # noqa: E402
from natbias_testing import MULTI30K, skip_without_data  # noqa: E402
from torch import nn  # noqa: E402
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM  # noqa: E402

from natbias.errors import NaturalBiasError  # noqa: E402
from natbias.hf import add_natural_bias, to_stock  # noqa: E402


def trained_looking(model):
    """b and the gain moved, as training moves them."""
    with torch.no_grad():
        model.output_bias().add_(torch.randn(V, generator=torch.Generator().manual_seed(1)))
        model.get_output_embeddings().gain_param.fill_(0.02)  # g = 0.4
    return model.eval()


@pytest.mark.parametrize("family", sorted(SLOTS))
def test_the_stock_class_gives_the_same_logits(family, tmp_path):
    model = trained_looking(add_natural_bias(build(family), zipf_targets()))
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    inputs = inputs_for(model)
    with torch.no_grad():
        expected = model(**inputs).logits
    stock = to_stock(model)
    assert type(stock).__name__ == FAMILIES[family][1]
    assert type(stock.config).__name__ == FAMILIES[family][0]
    assert "natural_bias" not in stock.config.to_dict()
    assert (stock.get_output_embeddings().weight is stock.get_input_embeddings().weight) == tied
    with torch.no_grad():
        assert (stock(**inputs).logits - expected).abs().max().item() <= 1e-4
    stock.save_pretrained(tmp_path)
    auto = AutoModelForSeq2SeqLM if is_seq2seq(stock) else AutoModelForCausalLM
    loaded = auto.from_pretrained(tmp_path)
    assert type(loaded) is type(stock) and loaded.config.model_type == stock.config.model_type
    with torch.no_grad():
        assert (loaded(**inputs).logits - expected).abs().max().item() <= 1e-4


def test_a_family_without_a_bias_slot_is_refused_naming_those_with_one():
    model = add_natural_bias(build("qwen2"), zipf_targets())
    with pytest.raises(NaturalBiasError) as error:
        to_stock(model)
    message = str(error.value)
    assert (
        message.startswith("Qwen2ForCausalLM has no output bias to hold b") and "\n" not in message
    )
    assert (
        "Marian, BART, mBART, Pegasus, Blenderbot" in message and "Phi, GPT-J, CodeGen" in message
    )
    assert type(model).__name__ == "NaturalBiasQwen2ForCausalLM"  # left as it was


def test_a_tied_head_with_no_affine_norm_before_it_is_untied_and_says_so(caplog):
    stock = build("phi", tie_word_embeddings=True)
    stock.model.final_layernorm = nn.LayerNorm(16, elementwise_affine=False)
    model = trained_looking(add_natural_bias(stock, zipf_targets()))
    embeddings = model.get_input_embeddings().weight.detach().clone()
    inputs = inputs_for(model)
    with torch.no_grad():
        expected = model(**inputs).logits
    with caplog.at_level(logging.WARNING, logger="natbias.hf.export"):
        exported = to_stock(model)
    assert "is untied from the input embeddings" in caplog.text
    assert exported.get_output_embeddings().weight is not exported.get_input_embeddings().weight
    assert exported.config.tie_word_embeddings is False
    assert torch.equal(exported.get_input_embeddings().weight, embeddings)
    with torch.no_grad():
        assert (exported(**inputs).logits - expected).abs().max().item() <= 1e-4


def lines(split, lang, count):
    with gzip.open(MULTI30K / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        return [line.strip() for line in itertools.islice(f, count)]


def pad_last_tokenizer(texts):
    """A unigram tokenizer trained here with <pad> as its last entry, as
    Marian's (Opus-MT's) vocabularies have it and CTranslate2 expects."""
    from tokenizers import SentencePieceUnigramTokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    model = SentencePieceUnigramTokenizer()
    model.train_from_iterator(
        texts,
        vocab_size=600,
        special_tokens=["</s>", "<unk>"],
        unk_token="<unk>",
        show_progress=False,
    )
    model.post_processor = TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 0)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=model, eos_token="</s>", unk_token="<unk>")
    tokenizer.add_special_tokens({"pad_token": "<pad>"})
    return tokenizer


@pytest.mark.training
def test_ctranslate2_serves_an_exported_marian_as_transformers_does(tmp_path):
    """CTranslate2's Marian converter starts the decoder from a zero
    embedding, as Opus-MT's pad row is: the row is kept at zero in training
    (a tied head would move it), and transformers starts from it."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from ctranslate2.converters import TransformersConverter

    if not (MULTI30K / "train.de.gz").exists():
        skip_without_data(f"Multi30k not found at {MULTI30K}")
    source, target = lines("train", "de", 1500), lines("train", "en", 1500)
    tests = lines("test_2016_flickr", "de", 200)
    tokenizer = pad_last_tokenizer(source + target)
    pad = tokenizer.pad_token_id
    config = transformers.MarianConfig(
        vocab_size=len(tokenizer),
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=128,
        activation_function="relu",
        scale_embedding=True,
        dropout=0.0,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=tokenizer.eos_token_id,
        forced_eos_token_id=None,  # CTranslate2 does not force one at the length limit
    )
    torch.manual_seed(1)
    model = transformers.MarianMTModel(config)
    embeddings = model.get_input_embeddings().weight
    sources, targets = tokenizer(source)["input_ids"], tokenizer(target)["input_ids"]
    model = add_natural_bias(model, targets)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(200):
        batch = slice(step * 32 % 1500, step * 32 % 1500 + 32)
        x = _pad(sources[batch], pad)
        loss = model(input_ids=x, attention_mask=x.ne(pad), labels=_pad(targets[batch], -100)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            embeddings[pad].zero_()
    model.eval()
    encoded = tokenizer(tests, return_tensors="pt", padding=True)
    with torch.no_grad():
        ours = model.generate(**encoded, num_beams=1, do_sample=False, max_new_tokens=40)
    to_stock(model).save_pretrained(tmp_path / "stock")
    tokenizer.save_pretrained(tmp_path / "stock")
    TransformersConverter(str(tmp_path / "stock")).convert(str(tmp_path / "ct2"))
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    served = translator.translate_batch(
        [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(tests)["input_ids"]],
        beam_size=1,
        max_decoding_length=40,
    )
    same = 0
    for result, generated in zip(served, ours.tolist()):
        ids = [token for token in generated[1:] if token != pad]  # the start token, padding
        ids = ids[:-1] if ids and ids[-1] == tokenizer.eos_token_id else ids
        same += tokenizer.convert_tokens_to_ids(result.hypotheses[0]) == ids
    assert same >= 0.99 * len(tests), f"{same} of {len(tests)} translations the same"
    assert len({tuple(g) for g in ours.tolist()}) > 20  # not one output for every input


def _pad(sequences, value):
    width = max(len(s) for s in sequences)
    return torch.tensor([s + [value] * (width - len(s)) for s in sequences])
