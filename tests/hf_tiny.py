"""Tiny fresh transformers generators of many families, built from
configurations in code (nothing fetched), for the tests of natbias.hf."""

import collections

import numpy as np
import torch
import transformers

V = 40  # vocabulary: 0 pad, 1 EOS, 2 BOS, 3.. words
# The sizes of each kind of configuration: all that a user changes in the
# family's defaults (``build_as_written``)...
DECODER = dict(
    vocab_size=V,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=64,
)
SEQ2SEQ = dict(
    vocab_size=V,
    d_model=16,
    encoder_layers=1,
    decoder_layers=1,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
    max_position_embeddings=64,
)
GPT = dict(vocab_size=V, n_embd=16, n_layer=1, n_head=2, n_positions=64)
T5 = dict(vocab_size=V, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)
# ... and the special ids of this vocabulary, which ``build`` sets too.
DECODER_IDS = dict(bos_token_id=2, eos_token_id=1, pad_token_id=0)
SEQ2SEQ_IDS = dict(DECODER_IDS, decoder_start_token_id=0, forced_eos_token_id=1)
GPT_IDS = dict(bos_token_id=2, eos_token_id=1)
T5_IDS = dict(pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)

# family -> (configuration class, model class, sizes, special ids)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", DECODER, DECODER_IDS),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", DECODER, DECODER_IDS),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(DECODER, head_dim=8), DECODER_IDS),
    "mistral": ("MistralConfig", "MistralForCausalLM", DECODER, DECODER_IDS),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(DECODER, head_dim=8), DECODER_IDS),
    # soft-capped
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(DECODER, head_dim=8), DECODER_IDS),
    "cohere": ("CohereConfig", "CohereForCausalLM", DECODER, DECODER_IDS),  # logits x logit_scale
    "phi": ("PhiConfig", "PhiForCausalLM", DECODER, DECODER_IDS),  # a bias on the head
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", DECODER, DECODER_IDS),
    "opt": (
        "OPTConfig",
        "OPTForCausalLM",
        dict(DECODER, ffn_dim=32, word_embed_proj_dim=16, num_key_value_heads=2),
        DECODER_IDS,
    ),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", GPT, GPT_IDS),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", dict(GPT, rotary_dim=4), GPT_IDS),
    "codegen": ("CodeGenConfig", "CodeGenForCausalLM", dict(GPT, rotary_dim=4, n_ctx=64), GPT_IDS),
    "t5": ("T5Config", "T5ForConditionalGeneration", T5, T5_IDS),
    "bart": ("BartConfig", "BartForConditionalGeneration", SEQ2SEQ, SEQ2SEQ_IDS),
    "mbart": ("MBartConfig", "MBartForConditionalGeneration", SEQ2SEQ, SEQ2SEQ_IDS),
    "marian": ("MarianConfig", "MarianMTModel", SEQ2SEQ, SEQ2SEQ_IDS),
    "m2m_100": ("M2M100Config", "M2M100ForConditionalGeneration", SEQ2SEQ, SEQ2SEQ_IDS),
    "pegasus": ("PegasusConfig", "PegasusForConditionalGeneration", SEQ2SEQ, SEQ2SEQ_IDS),
    "blenderbot": ("BlenderbotConfig", "BlenderbotForConditionalGeneration", SEQ2SEQ, SEQ2SEQ_IDS),
}
# Where the stock class keeps an output bias, b goes (natbias.hf.to_stock exports these).
SLOTS = {name: "final_logits_bias" for name in ("marian", "bart", "mbart", "pegasus", "blenderbot")}
SLOTS.update({name: "head" for name in ("phi", "gptj", "codegen")})
# What a user must set beyond the sizes because transformers itself refuses
# the model otherwise: Marian's default padding id (58100, also its decoder
# start) must index its embeddings. Its decoder start stays out of range.
REQUIRED = {"marian": dict(pad_token_id=0)}


def build(family, seed=0, **settings):
    """A fresh stock model of the family (seeded), with this vocabulary's ids."""
    _, _, sizes, ids = FAMILIES[family]
    return _build(family, seed, {**sizes, **ids, **settings})


def build_as_written(family, seed=0):
    """A fresh stock model whose configuration is the family's defaults with
    only the vocabulary and the sizes changed, as a user first writes it:
    special ids of the family's own vocabulary (GPT-2's 50256) kept."""
    return _build(family, seed, {**FAMILIES[family][2], **REQUIRED.get(family, {})})


def _build(family, seed, settings):
    config_class, model_class, _, _ = FAMILIES[family]
    config = getattr(transformers, config_class)(**settings)
    torch.manual_seed(seed)
    return getattr(transformers, model_class)(config)


def is_seq2seq(model):
    return bool(getattr(model.config, "is_encoder_decoder", False))


def zipf_targets(n=200, seed=0):
    """Token-id sequences ending in EOS (1), Zipf-like over ids 3..V-1."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, V - 2)
    weights /= weights.sum()
    return [
        list(rng.choice(np.arange(3, V), size=rng.integers(3, 9), p=weights)) + [1]
        for _ in range(n)
    ]


def hand_log_prior(sequences, causal, alpha=1.0):
    """log (c(v) + alpha) / (N + alpha V), counted with a Counter (float64)."""
    counter = collections.Counter()
    for sequence in sequences:
        counter.update(sequence[1:] if causal else sequence)
    counts = np.array([counter[i] for i in range(V)], dtype=np.float64)
    return torch.from_numpy(np.log((counts + alpha) / (counts.sum() + alpha * V)))


def inputs_for(model, seed=3):
    generator = torch.Generator().manual_seed(seed)
    inputs = {"input_ids": torch.randint(3, V, (2, 6), generator=generator)}
    if is_seq2seq(model):
        inputs["decoder_input_ids"] = torch.randint(3, V, (2, 5), generator=generator)
    return inputs


def max_kl_from(log_prior, logits):
    """The largest KL(p || prior) in nats over the positions of ``logits``."""
    log_p = torch.log_softmax(logits.double(), -1)
    return (log_p.exp() * (log_p - log_prior.double())).sum(-1).max().item()


def word_level_tokenizer(words):
    """A word-level tokenizer over ``words`` (ids 0 pad, 1 </s>, 2 <s>, 3 <unk>, then the
    words, then unused names up to V), every encoding ending in </s>; and its names by id."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    names = ["<pad>", "</s>", "<s>", "<unk>", *words]
    names += [f"unused{i}" for i in range(len(names), V)]
    word_level = Tokenizer(models.WordLevel({w: i for i, w in enumerate(names)}, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    word_level.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", 1)]
    )
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=word_level, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
        bos_token="<s>",
    )  # fmt: skip
    return tokenizer, names
