"""natbias-ct2-converter on fairseq checkpoints (fairseq_natbias.ct2).

Toy data: a checkpoint of every architecture of transformer_natbias and
transformer_lm_natbias (tiny sizes; each --natbias-init among them; tied and
untied; with and without the gain) is scored by CTranslate2 as by fairseq,
and differs with b zeroed; --natbias-order 2 is refused in one line. Real
text (Multi30k): CTranslate2 beam 5 translates the test sentences as
fairseq-generate does, in float32 and int8, and the language model's
per-token scores are fairseq-eval-lm's. Each trains its model with
fairseq-train (a few updates, or 200): the full tier."""

import re

import pytest
import torch

ctranslate2 = pytest.importorskip("ctranslate2")
from natbias_testing import (  # noqa: E402
    NO_LOADER_PROCESS,
    fairseq,
    load_fairseq_model,
    train,
    train_lm,
    write_multi30k_slice,
)

from natbias.ct2_converter import convert, main  # noqa: E402
from natbias.errors import NaturalBiasError  # noqa: E402

# Every architecture, each with one --natbias-init (and tying, weight init) of
# those the converter must take; sizes are the tests' tiny ones throughout.
TRANSLATION = {
    "transformer_natbias": ("toy_bin_joined", ["--share-all-embeddings"]),
    "transformer_natbias_iwslt_de_en": ("toy_bin", ["--natbias-init", "zero"]),
    "transformer_natbias_wmt_en_de": ("toy_bin", ["--natbias-init", "none"]),
    "transformer_natbias_afromt": ("toy_bin", ["--natbias-init", "file"]),
}
LANGUAGE_MODEL = {
    "transformer_lm_natbias": ["--natbias-weight-init", "paper"],  # no gain: g = 1
    "transformer_lm_natbias_gpt": ["--share-decoder-input-output-embed"],
    "transformer_lm_natbias_gpt2_small": ["--natbias-init", "zero"],
    "transformer_lm_natbias_tiny": ["--natbias-init", "none"],
}
BIAS = "decoder.output_projection.bias"


def test_every_architecture_of_the_plugin_is_covered():
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    import fairseq_natbias  # noqa: F401  (registers the architectures)

    ours = {a for a, m in ARCH_MODEL_NAME_REGISTRY.items() if m.endswith("_natbias")}
    assert ours == set(TRANSLATION) | set(LANGUAGE_MODEL)


def has_a_bias_to_zero(checkpoint):
    """b is there and far from 0 (not --natbias-init none or zero, a few updates in)."""
    bias = torch.load(checkpoint, map_location="cpu")["model"].get(BIAS)
    return bias is not None and bias.abs().max().item() > 1.0


def with_bias_zeroed(checkpoint, path):
    """A copy of the checkpoint whose b is 0: the control."""
    state = torch.load(checkpoint, map_location="cpu")
    state["model"][BIAS] = torch.zeros_like(state["model"][BIAS])
    torch.save(state, path)
    return path


def fairseq_scores(model, task, pairs):
    """log p of each target token and the end of sentence, as fairseq scores them."""
    scores = []
    source, target = task.source_dictionary, task.target_dictionary
    for src, tgt in pairs:
        tokens = [target.index(w) for w in tgt] + [target.eos()]
        src_ids = torch.tensor([[source.index(w) for w in src] + [source.eos()]])
        previous = torch.tensor([[target.eos()] + tokens[:-1]])
        with torch.no_grad():
            out = model(src_ids, torch.tensor([src_ids.shape[1]]), previous)
            log_p = model.get_normalized_probs(out, log_probs=True)[0]
        scores.append(log_p.gather(-1, torch.tensor(tokens)[:, None])[:, 0])
    return scores


def lines_of(path, count=None):
    return [line.split() for line in path.read_text(encoding="utf-8").splitlines()][:count]


def largest_difference(ours, theirs):
    return max((torch.tensor(a) - b).abs().max().item() for a, b in zip(ours, theirs))


@pytest.mark.parametrize("arch", sorted(TRANSLATION))
@pytest.mark.training
def test_a_translation_checkpoint_is_scored_by_ctranslate2_as_by_fairseq(
    arch, request, tmp_path, toy_text
):
    data_name, options = TRANSLATION[arch]
    data = request.getfixturevalue(data_name)
    if "file" in options:
        counts = tmp_path / "train.counts"
        dictionary = data / "dict.tgt.txt"
        text = toy_text / "train.tgt"
        fairseq("natbias-count", "--dict", dictionary, "--text", text, "--output", counts)
        options = [*options, "--natbias-counts", counts]
    train(data, tmp_path / "run", *options, arch=arch, max_update=3)
    checkpoint = tmp_path / "run" / "checkpoint_last.pt"
    model, task = load_fairseq_model(checkpoint, data)
    pairs = list(zip(lines_of(toy_text / "valid.src"), lines_of(toy_text / "valid.tgt")))
    expected = fairseq_scores(model, task, pairs)
    translator = ctranslate2.Translator(
        convert(checkpoint, tmp_path / "ct2", data), intra_threads=1
    )
    served = translator.score_batch([s for s, _ in pairs], [t for _, t in pairs])
    assert largest_difference([s.log_probs for s in served], expected) <= 1e-4
    gain = model.decoder.output_projection.gain()
    assert gain is None or gain.item() < 0.5  # far from 1: a gain left unfolded would show
    if not has_a_bias_to_zero(checkpoint):
        return
    zeroed = with_bias_zeroed(checkpoint, tmp_path / "zeroed.pt")
    translator = ctranslate2.Translator(convert(zeroed, tmp_path / "zero", data), intra_threads=1)
    served = translator.score_batch([s for s, _ in pairs], [t for _, t in pairs])
    assert largest_difference([s.log_probs for s in served], expected) > 0.05


def lm_scores(model, task, sentences):
    """log p of each token and the end of sentence, the previous end of
    sentence as the first input (fairseq-eval-lm's --sample-break-mode eos)."""
    dictionary = task.target_dictionary
    scores = []
    for words in sentences:
        tokens = [dictionary.index(w) for w in words] + [dictionary.eos()]
        with torch.no_grad():
            out = model(torch.tensor([[dictionary.eos()] + tokens[:-1]]))
            log_p = model.get_normalized_probs(out, log_probs=True)[0]
        scores.append(log_p.gather(-1, torch.tensor(tokens)[:, None])[:, 0])
    return scores


@pytest.mark.parametrize("arch", sorted(LANGUAGE_MODEL))
@pytest.mark.training
def test_a_language_model_is_scored_by_ctranslate2_as_by_fairseq(
    arch, tmp_path, toy_lm_bin, toy_text
):
    train_lm(toy_lm_bin, tmp_path / "run", *LANGUAGE_MODEL[arch], arch=arch, max_update=3)
    checkpoint = tmp_path / "run" / "checkpoint_last.pt"
    model, task = load_fairseq_model(checkpoint, toy_lm_bin)
    sentences = lines_of(toy_text / "valid.tgt")
    expected = lm_scores(model, task, sentences)
    generator = ctranslate2.Generator(
        convert(checkpoint, tmp_path / "ct2", toy_lm_bin), intra_threads=1
    )
    served = generator.score_batch([["</s>", *words, "</s>"] for words in sentences])
    assert largest_difference([s.log_probs for s in served], expected) <= 1e-4
    if has_a_bias_to_zero(checkpoint):
        zeroed = with_bias_zeroed(checkpoint, tmp_path / "zeroed.pt")
        generator = ctranslate2.Generator(
            convert(zeroed, tmp_path / "zero", toy_lm_bin), intra_threads=1
        )
        served = generator.score_batch([["</s>", *words, "</s>"] for words in sentences])
        assert largest_difference([s.log_probs for s in served], expected) > 0.05


@pytest.mark.training
def test_the_bigram_residual_is_refused_in_one_line(toy_bin, tmp_path):
    train(toy_bin, tmp_path / "run", "--natbias-order", "2", max_update=1)
    checkpoint = tmp_path / "run" / "checkpoint_last.pt"
    with pytest.raises(NaturalBiasError, match="bigram residual of --natbias-order 2"):
        convert(checkpoint, tmp_path / "ct2", toy_bin)
    with pytest.raises(SystemExit) as stop:
        arguments = ["--model_path", checkpoint, "--data_dir", toy_bin]
        main([*map(str, arguments), "--output_dir", str(tmp_path / "ct2")])
    assert str(stop.value).startswith("natbias-ct2-converter: error: ")
    assert "bigram residual" in str(stop.value) and "\n" not in str(stop.value)
    assert not (tmp_path / "ct2").exists()


# --- real text: Multi30k De-En (the full tier) ------------------------------------------

# The first 5,000 pairs with a joint SentencePiece vocabulary of 1,000 pieces
# (the demo's size), binarised here: a 1+1-layer model without dropout ends
# its translations where sentences end after 200 updates (~15 s of training),
# where the shared 8,000-piece data (multi30k_bin) costs several times that
# per update. Hypotheses that run to the length limit (degenerate repetitions,
# which a less trained model makes) are where the two beam searches part: at
# the limit fairseq forces the end of sentence and CTranslate2 does not.
# 200 test sentences.
SLICE = {"train": 5000, "val": 100, "test_2016_flickr": 200}
TRANSLATION_TRAINING = [
    "--share-all-embeddings",
    "--encoder-layers", "1", "--decoder-layers", "1",
    "--lr", "5e-3", "--warmup-updates", "20", "--dropout", "0",
    "--disable-validation", "--save-interval", "1000",
    "--log-interval", "50", "--no-natbias-logging",
]  # fmt: skip
BEAM = ["--beam", "5", "--batch-size", "50", "--required-batch-size-multiple", "1", "--cpu"]
MAX_LENGTH = 200  # fairseq-generate's default --max-len-b, given to CTranslate2 too


@pytest.fixture(scope="module")
def multi30k_small(tmp_path_factory):
    from natbias.tools import sentencepiece_text

    root = write_multi30k_slice(tmp_path_factory.mktemp("ct2_multi30k"), SLICE)
    sentencepiece_text.train([root / "train.de", root / "train.en"], root / "spm", 1000)
    files = [root / f"{split}.{lang}" for split in SLICE for lang in ("de", "en")]
    sentencepiece_text.encode_files(root / "spm.model", files, root / "pieces")
    pieces = root / "pieces"
    fairseq(
        "fairseq-preprocess", "--source-lang", "de", "--target-lang", "en",
        "--trainpref", pieces / "train", "--validpref", pieces / "val",
        "--testpref", pieces / "test_2016_flickr", "--destdir", root / "bin",
        "--joined-dictionary", "--workers", "1",
    )  # fmt: skip
    return root


@pytest.fixture(scope="module")
def translation_model(multi30k_small):
    save_dir = multi30k_small / "model"
    train(multi30k_small / "bin", save_dir, *TRANSLATION_TRAINING, max_update=200)
    return save_dir / "checkpoint_last.pt"


def detokenized(pieces):
    return "".join(pieces).replace("\u2581", " ").strip()


def bleu(hypotheses, references):
    import sacrebleu

    return sacrebleu.corpus_bleu([detokenized(h) for h in hypotheses], [references]).score


# CTranslate2 scores each token within SCORES of fairseq (the tests above): a
# beam may part from fairseq's where two hypotheses' sentence scores (mean log
# p a token) are within 2 x SCORES under fairseq, a tie either engine may
# break, and only there. The control (b zeroed) must change at least CHANGED
# of the sentences, far more than SAME lets ties change.
SCORES = 1e-4
TIE = 2 * SCORES
SAME = 0.98
CHANGED = 0.10
# int8 stores each weight, and each activation row, to half a step of 1/127 of
# its row's largest: about 2^-8 of a logit's size (about 1 here) from each of
# the ~8 products on a token's path, weights and activations: 8 x 2 x 2^-8 =
# 2^-4 nats of mean |log p| apart from float32 (measured: 0.010; with b zeroed,
# 3.5). BLEU is not compared: a tie broken otherwise by another instruction
# set's int8 kernels changes a sentence and moves it.
INT8 = 2.0**-4


def sentence_score(model, task, source, hypothesis):
    """fairseq's mean log p a token of ``hypothesis`` (its end of sentence included)."""
    return fairseq_scores(model, task, [(source, hypothesis)])[0].mean().item()


@pytest.mark.training
def test_ctranslate2_translates_real_text_as_fairseq_generate(
    multi30k_small, translation_model, tmp_path
):
    """Beam 5: the same hypothesis for >= 98% of the sentences, each other one
    a tie under fairseq's scores, and BLEU within 0.2 in float32. int8: its
    scores of fairseq's hypotheses within int8's rounding of fairseq's (not
    its BLEU, which moves with the instruction set's kernels). The control:
    with b zeroed in the converted model, at least 10% of the hypotheses change."""
    from natbias.tools.generate_output import parse_generate_output

    data = multi30k_small / "bin"
    arguments = [data, "--path", translation_model, "--user-dir", "fairseq_natbias"]
    generated = fairseq("fairseq-generate", *arguments, *BEAM, *NO_LOADER_PROCESS)
    sentences = parse_generate_output(generated.stdout.splitlines())
    sources = lines_of(multi30k_small / "pieces" / "test_2016_flickr.de")
    ours = [sentences[i].hypothesis.split() for i in range(len(sources))]
    references = (multi30k_small / "test_2016_flickr.en").read_text("utf-8").splitlines()
    assert bleu(ours, references) > 5  # translations, not noise (a fresh model scores ~0)

    def served(checkpoint, name):
        converted = convert(checkpoint, tmp_path / name, data, quantization=name.split("-")[0])
        compute = name.split("-")[0]
        translator = ctranslate2.Translator(converted, intra_threads=1, compute_type=compute)
        results = translator.translate_batch(
            sources, beam_size=5, max_batch_size=50, max_decoding_length=MAX_LENGTH
        )
        hypotheses = [result.hypotheses[0] for result in results]
        return sum(h == o for h, o in zip(hypotheses, ours)) / len(ours), hypotheses, translator

    model, task = load_fairseq_model(translation_model, data)
    same, hypotheses, _ = served(translation_model, "float32")
    assert same >= SAME
    for i, (theirs, mine) in enumerate(zip(hypotheses, ours)):
        if theirs != mine:
            gap = sentence_score(model, task, sources[i], mine) - sentence_score(
                model, task, sources[i], theirs
            )
            assert abs(gap) <= TIE, f"sentence {i}: fairseq scores the two {gap:.2e} apart"
    assert abs(bleu(hypotheses, references) - bleu(ours, references)) <= 0.2

    pairs = list(zip(sources, ours))
    expected = fairseq_scores(model, task, pairs)

    def mean_gap(translator):
        """Mean |log p| a token between ``translator``'s scores of fairseq's hypotheses and fairseq's."""
        scored = translator.score_batch([s for s, _ in pairs], [t for _, t in pairs])
        gaps = [torch.tensor(r.log_probs) - e for r, e in zip(scored, expected, strict=True)]
        return torch.cat(gaps).abs().mean().item()

    _, _, translator = served(translation_model, "int8")
    assert mean_gap(translator) <= INT8

    zeroed = with_bias_zeroed(translation_model, tmp_path / "zeroed.pt")
    same_without_b, _, translator = served(zeroed, "float32-zeroed")
    assert 1 - same_without_b >= CHANGED
    assert mean_gap(translator) > INT8


def eval_lm_word_scores(output):
    """``{sentence id: [(token, log p), ...]}`` from fairseq-eval-lm --output-word-probs
    (its process logs them as "INFO:fairseq_cli.eval_lm:ID ...": importing fairseq
    sets up logging before eval_lm's own format could apply)."""
    scores = {}
    for line in output.splitlines():
        match = re.search(r"fairseq_cli\.eval_lm(?: \| |:)(\d+) (.*\])$", line)
        if match:
            words = [entry.rpartition(" [") for entry in match[2].split("\t")]
            scores[int(match[1])] = [(word, float(value[:-1])) for word, _, value in words]
    return scores


@pytest.mark.training
def test_the_language_models_token_scores_are_fairseq_eval_lms(
    multi30k_lm_bin, multi30k_text, tmp_path
):
    """Multi30k English (the shared 8,000-piece data), every test sentence:
    each token's log p within 1e-3 of fairseq-eval-lm's (which prints 6
    decimals); with b zeroed, not."""
    tying = "--share-decoder-input-output-embed"
    # blocks of 64: every test sentence whole (the tiny default, 32, skips the longest)
    train_lm(multi30k_lm_bin, tmp_path / "run", tying, "--tokens-per-sample", "64", max_update=8)
    checkpoint = tmp_path / "run" / "checkpoint_last.pt"
    arguments = [multi30k_lm_bin, "--path", checkpoint, "--user-dir", "fairseq_natbias"]
    evaluated = fairseq(
        "fairseq-eval-lm", *arguments, "--gen-subset", "test", "--sample-break-mode", "eos",
        "--output-word-probs", "--cpu", *NO_LOADER_PROCESS,
    )  # fmt: skip
    expected = eval_lm_word_scores(evaluated.stdout + evaluated.stderr)
    sentences = lines_of(multi30k_text / "test.en")
    assert sorted(expected) == list(range(len(sentences)))
    for i, words in enumerate(sentences):
        assert [word for word, _ in expected[i]] == [*words, "</s>"]

    def largest_error(checkpoint, name):
        generator = ctranslate2.Generator(
            convert(checkpoint, tmp_path / name, multi30k_lm_bin), intra_threads=1
        )
        served = generator.score_batch([["</s>", *words, "</s>"] for words in sentences])
        return max(
            abs(ours - theirs)
            for i, result in enumerate(served)
            for ours, (_, theirs) in zip(result.log_probs, expected[i])
        )

    assert largest_error(checkpoint, "ct2") <= 1e-3
    assert largest_error(with_bias_zeroed(checkpoint, tmp_path / "zeroed.pt"), "zero") > 1e-3
