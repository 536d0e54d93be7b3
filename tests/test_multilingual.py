"""The natural bias in fairseq's multilingual translation (``--task
translation_multi_simple_epoch``): the prior counted as the task's own batches
feed the targets, one prior per target language (``--natbias-prior
per-language``), the counts file with any task, and bad input in one line.
Real text: Multi30k's German, French and English, one SentencePiece model."""

import copy
import json
import math
import re
import shutil
import sys
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from natbias_fixtures import built_once
from natbias_testing import (
    MULTI30K,
    NO_LOADER_PROCESS,
    REPO,
    TINY_LM,
    TINY_LM_TRAINING,
    TINY_MODEL,
    TINY_TRAINING,
    build_in_process,
    fairseq,
    log_records,
    multi30k_has,
    reference_log_unigram,
    skip_without_data,
)

from fairseq_natbias.language_prior import ROWS_KEY
from fairseq_natbias.training_data import count_training_targets
from natbias.errors import NaturalBiasError

sys.path.insert(0, str(REPO / "examples/multilingual"))
from prepare import prepare  # noqa: E402

PAIRS = ["en-de", "en-fr", "de-en", "fr-en"]
ONE_TO_MANY = ["--lang-pairs", "en-de,en-fr"]
LANGTOKS = ["--encoder-langtok", "src", "--decoder-langtok"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """600 Multi30k sentences a pair, a 1,000-piece joint SentencePiece model."""
    if not multi30k_has("de", "en", "fr"):
        skip_without_data(f"Multi30k's de, en and fr not found at {MULTI30K}")
    pairs = [p.split("-") for p in PAIRS]
    return built_once(
        tmp_path_factory,
        "multilingual_bin",
        lambda out: prepare(MULTI30K, out, pairs, 600, 100, 1000),
    )


def task_args(*extra):
    return ["--task", "translation_multi_simple_epoch", *extra]


def build(data, tmp_path, *extra):
    return build_in_process(data, tmp_path / "ck", *task_args(*extra), "--share-all-embeddings")


def epoch_target_counts(task, vocab):
    """What the task's own batches hold as targets over epoch 1 (padding left out)."""
    task.load_dataset("train", epoch=1, combine=True)
    batches = task.get_batch_iterator(task.dataset("train"), max_tokens=4000, epoch=1)
    counts = np.zeros(vocab, dtype=np.int64)
    for sample in batches.next_epoch_itr(shuffle=False):
        target = sample["target"]
        counts += np.bincount(target[target != task.target_dictionary.pad()], minlength=vocab)
    return counts


@pytest.mark.parametrize(
    "options",
    [
        [*ONE_TO_MANY, *LANGTOKS],  # the language token is the first target
        ["--lang-pairs", "de-en,fr-en", *LANGTOKS, "--lang-tok-replacing-bos-eos"],  # an input
        ["--lang-pairs", "en-de,de-en,fr-en", "--lang-tok-style", "mbart", *LANGTOKS],
        ["--lang-pairs", "en-de,fr-en"],  # no language tokens
        [*ONE_TO_MANY, *LANGTOKS, "--lang-dict", "{langs}"],
        [*ONE_TO_MANY, *LANGTOKS, "--fixed-dictionary", "{data}/dict/dict.txt"],
    ],
    ids=["one-to-many", "replacing-bos", "many-to-many-mbart", "no-langtok", "lang-dict", "fixed"],
)
def test_the_prior_counts_what_an_epochs_batches_hold(data, tmp_path, options):
    """Concatenated pairs (the task's default): exactly the targets of one epoch."""
    (tmp_path / "langs.txt").write_text("fr\nen\nde\n")
    options = [o.format(langs=tmp_path / "langs.txt", data=data) for o in options]
    task, model, _ = build(data, tmp_path, *options)
    vocab = len(task.target_dictionary)
    expected = count_training_targets(task)
    assert np.array_equal(expected, epoch_target_counts(task, vocab))


@pytest.fixture(scope="module")
def unequal(data, tmp_path_factory):
    """The data with en-de twice (train and train1: 1,200 sentences against
    en-fr's 600), so that sampling weighs the pairs otherwise than concatenation."""
    bigger = tmp_path_factory.mktemp("unequal") / "data"
    shutil.copytree(data, bigger)
    for side in ("en", "de"):
        for ext in ("bin", "idx"):
            shutil.copy(bigger / f"train.en-de.{side}.{ext}", bigger / f"train1.en-de.{side}.{ext}")
    return bigger


TEMPERATURE_5 = ["--sampling-method", "temperature", "--sampling-temperature", "5"]


def test_the_prior_weighs_pairs_as_the_task_samples_them(unequal, tmp_path):
    """Temperature sampling over pairs of unequal size: each target language's
    share of an epoch's target tokens is the counted one (sampling noise: 1%),
    not what concatenation would give, and so is the total (the scale that
    add-one smoothing is weighed against)."""
    options = ["--lang-pairs", "en-de,en-fr", *LANGTOKS]
    task, _, _ = build(unequal, tmp_path, *options, *TEMPERATURE_5)
    counted = count_training_targets(task)
    epoch = epoch_target_counts(task, len(counted))
    de = task.data_manager.get_decoder_langtok("de", "tgt")
    share = {"counted": counted[de] / counted.sum(), "epoch": epoch[de] / epoch.sum()}
    concatenated = count_training_targets(build(unequal, tmp_path, *options)[0])
    assert abs(share["counted"] - share["epoch"]) < 0.01 * share["epoch"], share
    assert abs(concatenated[de] / concatenated.sum() - share["epoch"]) > 0.05 * share["epoch"]
    assert abs(counted.sum() - epoch.sum()) < 0.01 * epoch.sum(), (counted.sum(), epoch.sum())


# Given weights: en-fr (600 sentences) drawn 4 times as often as en-de (1,200).
GIVEN_WEIGHTS = {"main:en-de": 0.2, "main:en-fr": 0.8}
SAMPLING = {
    "concat": [],
    "temperature-1.5": ["--sampling-method", "temperature", "--sampling-temperature", "1.5"],
    "temperature-5": TEMPERATURE_5,
    "uniform": ["--sampling-method", "uniform"],
    "weights": ["--sampling-weights", json.dumps(GIVEN_WEIGHTS)],
    "weights-from-file": ["--sampling-weights-from-file", "{file}"],  # GIVEN_WEIGHTS, written
}


def drawn_weights(task, sentences):
    """Each pair's sentences' draws in epoch 1 of the sampled data, per
    sentence of the pair (en-de, en-fr): counted from what the task's own
    batches hold (each target sentence starts with its language's token),
    not worked out from fairseq's sampling rules nor natbias's."""
    epoch = epoch_target_counts(task, len(task.target_dictionary))
    drawn = [epoch[task.data_manager.get_decoder_langtok(lang, "tgt")] for lang in ("de", "fr")]
    return [int(d) / n for d, n in zip(drawn, sentences, strict=True)]


def step0_bits(task, model, priors):
    """Validation bits per target token of a fresh model, by target language
    (the words and EOS after the language token) and at position 0 (the
    language token), with each reference prior's cross-entropy on the same tokens."""
    task.load_dataset("valid", combine=False, epoch=1)
    batches = task.get_batch_iterator(task.dataset("valid"), max_tokens=4000)
    language_of = {task.data_manager.get_decoder_langtok(t, "tgt"): t for t in ("de", "fr")}
    sums = {}
    model.eval()
    with torch.no_grad():
        for sample in batches.next_epoch_itr(shuffle=False):
            log_p = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
            target = sample["target"]
            nll = -log_p.gather(-1, target.unsqueeze(-1)).squeeze(-1)
            for i, first in enumerate(target[:, 0].tolist()):
                words = target[i, 1:][target[i, 1:] != task.target_dictionary.pad()]
                for where, tokens, model_nll in (
                    (language_of[first], words, nll[i, 1 : 1 + len(words)].sum()),
                    ("langtok", target[i, :1], nll[i, 0]),
                ):
                    row = sums.setdefault(where, Counter())
                    row["model"] += model_nll.item()
                    row["tokens"] += len(tokens)
                    for name, prior in priors[where].items():
                        row[name] -= prior[tokens].sum().item()
    return {
        where: {k: v / row["tokens"] / math.log(2) for k, v in row.items() if k != "tokens"}
        for where, row in sums.items()
    }


@pytest.mark.parametrize("prior", ["per-language", "pooled"])
@pytest.mark.parametrize("sampling", SAMPLING)
def test_a_fresh_model_starts_at_the_unigram_of_what_the_task_samples(
    unequal, tmp_path, sampling, prior
):
    """Bits per validation token at step 0, against unigrams counted here from
    the text and weighted by the sentences the task's epoch drew from each
    pair (drawn_weights; en-de 1,200 sentences, en-fr 600): each language's row within 0.02 bits of that
    language's own unigram, the pooled row (every position of a pooled
    model, the language token's position of a per-language one) within 0.02
    bits of the sampled mixture's. 2.2.0 scaled the sampled counts to one
    sentence, and add-one smoothing made its prior nearly uniform (+3 bits)."""
    weights_file = tmp_path / "weights.json"
    weights_file.write_text(json.dumps(GIVEN_WEIGHTS))
    options = [o.replace("{file}", str(weights_file)) for o in SAMPLING[sampling]]
    task, model, _ = build(unequal, tmp_path, *ONE_TO_MANY, *LANGTOKS, *options,
                           "--natbias-prior", prior)  # fmt: skip
    dictionary, pieces = task.target_dictionary, unequal / "pieces"
    w_de, w_fr = drawn_weights(task, [1200, 600])
    langtoks = {
        task.data_manager.get_decoder_langtok(t, "tgt"): n
        for t, n in (("de", 1200 * w_de), ("fr", 600 * w_fr))
    }
    own = {
        "de": reference_log_unigram([pieces / "train.de"] * 2, dictionary, weights=[w_de] * 2),
        "fr": reference_log_unigram([pieces / "train.fr"], dictionary, weights=[w_fr]),
    }
    mixture = reference_log_unigram(
        [pieces / "train.de", pieces / "train.de", pieces / "train.fr"], dictionary,
        weights=[w_de, w_de, w_fr], extra=langtoks,
    )  # fmt: skip
    priors = {"langtok": {"mixture": mixture}}
    priors.update({lang: {"own": own[lang], "mixture": mixture} for lang in own})
    bits = step0_bits(task, model, priors)
    for where, row in bits.items():
        reference = "own" if prior == "per-language" and where != "langtok" else "mixture"
        assert abs(row["model"] - row[reference]) < 0.02, (where, reference, row)
    if prior == "per-language":  # each language's own unigram, not the mixture's
        assert all(row["mixture"] - row["own"] > 0.1 for w, row in bits.items() if w != "langtok")


def test_with_the_language_token_replacing_bos_each_row_starts_at_its_language(data, tmp_path):
    """--lang-tok-replacing-bos-eos: the language token is the decoder's first
    input, not a target, so every position has its language's row. A fresh
    model's bits per validation target token (words and EOS), by language,
    within 0.02 bits of that language's unigram counted here, which is more
    than 0.1 bits below the pooled one's (the pooled row everywhere would fail)."""
    options = [*ONE_TO_MANY, *LANGTOKS, "--lang-tok-replacing-bos-eos"]
    task, model, _ = build(data, tmp_path, *options, "--natbias-prior", "per-language")
    dictionary, pieces = task.target_dictionary, data / "pieces"
    own = {lang: _reference([pieces / f"train.{lang}"], dictionary) for lang in ("de", "fr")}
    pooled = _reference([pieces / "train.de", pieces / "train.fr"], dictionary)
    language_of = {task.data_manager.get_decoder_langtok(t, "tgt"): t for t in own}
    task.load_dataset("valid", combine=False, epoch=1)
    sums = {lang: Counter() for lang in own}
    model.eval()
    with torch.no_grad():
        for sample in task.get_batch_iterator(
            task.dataset("valid"), max_tokens=4000
        ).next_epoch_itr(shuffle=False):
            log_p = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
            target = sample["target"]
            first_inputs = sample["net_input"]["prev_output_tokens"][:, 0].tolist()
            for i, first in enumerate(first_inputs):
                real = target[i] != dictionary.pad()
                tokens = target[i][real]
                row = sums[language_of[first]]
                row["model"] -= log_p[i][real].gather(-1, tokens[:, None]).sum().item()
                row["own"] -= own[language_of[first]][tokens].double().sum().item()
                row["pooled"] -= pooled[tokens].double().sum().item()
                row["tokens"] += len(tokens)
    for lang, row in sums.items():
        bits = {k: v / row["tokens"] / math.log(2) for k, v in row.items() if k != "tokens"}
        assert row["tokens"] > 0 and abs(bits["model"] - bits["own"]) < 0.02, (lang, bits)
        assert bits["pooled"] - bits["own"] > 0.1, (lang, bits)


def _reference(paths, dictionary, extra=None):
    """The add-one log unigram of pieces files, counted in the test, as float32."""
    return reference_log_unigram(paths, dictionary, extra=extra).float()


@pytest.fixture(scope="module")
def per_language(data, tmp_path_factory):
    """A fresh one-to-many model with one prior per target language."""
    work = tmp_path_factory.mktemp("per_language")
    return build(data, work, *ONE_TO_MANY, *LANGTOKS, "--natbias-prior", "per-language")


def test_each_row_is_its_languages_unigram_and_row_0_the_pooled_one(data, per_language):
    task, model, _ = per_language
    dictionary, bias = task.target_dictionary, model.decoder.output_projection.bias
    tokens = {lang: task.data_manager.get_decoder_langtok(lang, "tgt") for lang in ("de", "fr")}
    pieces = data / "pieces"
    pooled = _reference(
        [pieces / "train.de", pieces / "train.fr"], dictionary, {t: 600 for t in tokens.values()}
    )
    expected = [pooled, *(_reference([pieces / f"train.{lang}"], dictionary) for lang in tokens)]
    assert torch.allclose(bias.detach(), torch.stack(expected), atol=1e-5)
    assert torch.equal(model.target_log_unigram, bias.detach())


CRITERIA = {
    "label-smoothing": ["--criterion", "unigram_label_smoothed_cross_entropy"],
    "regulariser": ["--criterion", "unigram_regularized_cross_entropy", "--unigram-reg-weight",
                    "0.3", "--unigram-reg-updates", "5"],
}  # fmt: skip


@pytest.mark.parametrize("criterion_name", CRITERIA)
def test_a_per_language_models_criterion_smooths_towards_the_pooled_unigram(
    data, tmp_path, criterion_name
):
    """A per-language model with each unigram criterion: omega is the pooled
    row, the unigram of every target (language tokens included) counted here,
    and the loss on validation sentences is computed by hand from it: per
    token (1 - eps)(-log p(y)) + eps CE(omega, p); the regulariser (on at
    update 0): fairseq's label smoothing plus lambda sum_v omega(v) log p(v)."""
    options = [*ONE_TO_MANY, *LANGTOKS, "--natbias-prior", "per-language", "--dropout", "0"]
    task, model, criterion = build(
        data, tmp_path, *options, *CRITERIA[criterion_name], "--label-smoothing", "0.1"
    )
    pieces, dictionary = data / "pieces", task.target_dictionary
    tokens = {task.data_manager.get_decoder_langtok(t, "tgt"): 600 for t in ("de", "fr")}
    omega = _reference([pieces / "train.de", pieces / "train.fr"], dictionary, tokens).exp()
    sample = _valid_batch(task)
    regularising = criterion_name == "regulariser"
    model.train(regularising)  # the regulariser acts in training only (update 0: on)
    loss, _, _ = criterion(model, sample)
    with torch.no_grad():
        log_p = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True).double()
    target = sample["target"]
    keep = target != dictionary.pad()
    nll = -log_p.gather(-1, target[..., None])[..., 0]
    cross = -(omega.double() * log_p).sum(-1)
    if regularising:  # fairseq's uniform label smoothing, then lambda sum_v omega(v) log p(v)
        uniform = 0.1 / (log_p.shape[-1] - 1)
        per_token = (0.9 - uniform) * nll - uniform * log_p.sum(-1) - 0.3 * cross
    else:
        per_token = 0.9 * nll + 0.1 * cross
    expected = per_token[keep].sum().item()
    assert loss.item() == pytest.approx(expected, rel=1e-5), (loss.item(), expected)


def _valid_batch(task, n=40):
    if "valid" not in task.datasets:  # fairseq 0.12's multilingual task cannot load it twice
        task.load_dataset("valid", combine=False, epoch=1)
    dataset = task.dataset("valid")
    half = len(dataset) // 2  # the en-de sentences, then the en-fr ones
    return dataset.collater([dataset[i] for i in [*range(n // 2), *range(half, half + n // 2)]])


def test_a_fresh_model_predicts_each_sentences_language_from_its_token_on(per_language):
    """Position 0 (input EOS) uses row 0; from the language token on, the
    sentence's language's row: a fresh model's prediction is within 0.02 bits
    (KL) of that language's unigram there, and far from the other language's."""
    task, model, _ = per_language
    sample = _valid_batch(task)
    model.eval()
    with torch.no_grad():
        net_output = model(**sample["net_input"])
        log_p = model.get_normalized_probs(net_output, log_probs=True)
    rows, target = net_output[1][ROWS_KEY], sample["target"]
    row_of = {t: r for r, t in enumerate(model.natbias_args.natbias_language_tokens, 1)}
    expected = torch.tensor([row_of[int(t)] for t in target[:, 0]])
    assert (rows[:, 0] == 0).all() and (rows[:, 1:] == expected[:, None]).all()
    prior = model.target_log_unigram
    real = target[:, 1:] != task.target_dictionary.pad()
    for chosen in (expected, 3 - expected):  # each sentence's row, then the other language's
        log_u = prior[chosen][:, None, :]
        kl = (log_p[:, 1:].exp() * (log_p[:, 1:] - log_u)).sum(-1)[real].mean() / math.log(2)
        assert (kl < 0.02) if chosen is expected else (kl > 0.3), float(kl)


def test_incremental_decoding_picks_the_rows_of_a_full_forward(per_language):
    """fairseq-generate's path (decoder.forward with an incremental state, one
    position at a time) scores as the full forward does."""
    task, model, _ = per_language
    sample = _valid_batch(task, 6)
    net_input = sample["net_input"]
    model.eval()
    with torch.no_grad():
        full = model(**net_input)[0]
        encoder_out = model.encoder(net_input["src_tokens"], net_input["src_lengths"])
        state, prev = {}, net_input["prev_output_tokens"]
        steps = [
            model.decoder.forward(prev[:, : t + 1], encoder_out, incremental_state=state)[0]
            for t in range(prev.shape[1])
        ]
    real = prev != task.target_dictionary.pad()  # padding is attended differently
    assert torch.allclose(torch.cat(steps, dim=1)[real], full[real], atol=1e-4)


def _counts_file(data, tmp_path):
    from natbias import count_cli

    path = tmp_path / "de.counts"
    count_cli.main(["--dict", str(data / "dict.de.txt"), "--text", str(data / "pieces/train.de"),
                "--output", str(path)])  # fmt: skip
    return path


def test_the_bias_scale_scales_each_positions_row(per_language, monkeypatch):
    """Generation-time lambda (natbias_bias_scale): g W phi + lambda b[row]."""
    task, model, _ = per_language
    net_input = _valid_batch(task, 4)["net_input"]
    model.eval()
    with torch.no_grad():
        out = model(**net_input)
        expected = (
            out[0] - 0.5 * model.decoder.output_projection.bias[out[1][ROWS_KEY]]
        ).log_softmax(-1)
        monkeypatch.setattr(model.natbias_args, "natbias_bias_scale", 0.5, raising=False)
        scaled = model.get_normalized_probs(model(**net_input), log_probs=True)
    assert torch.allclose(scaled, expected, atol=1e-5)


def test_lambda_and_tau_act_on_each_positions_row_of_b_and_of_log_p(per_language, monkeypatch):
    """g W phi + lambda b[row] - tau log p[row], computed here from the
    decoder's features, with b moved off the prior by a ramp (as training
    moves it), so that tau taking b, or a row from the wrong tensor, fails."""
    import torch.nn.functional as F

    task, model, _ = per_language
    net_input = _valid_batch(task, 4)["net_input"]
    projection, prior = model.decoder.output_projection, model.target_log_unigram
    model.eval()
    saved = projection.bias.detach().clone()
    try:
        with torch.no_grad():
            projection.bias.add_(torch.linspace(-2.0, 2.0, saved.shape[-1]))
            encoder_out = model.encoder(net_input["src_tokens"], net_input["src_lengths"])
            prev = net_input["prev_output_tokens"]
            phi, _ = model.decoder(prev, encoder_out, features_only=True)
            rows = model.decoder.prior_rows(prev)
            context = F.linear(phi * projection.gain(), projection.weight)
            expected = (context + 0.5 * projection.bias[rows] - 0.7 * prior[rows]).log_softmax(-1)
            monkeypatch.setattr(model.natbias_args, "natbias_bias_scale", 0.5, raising=False)
            monkeypatch.setattr(model.natbias_args, "natbias_logit_adjustment", 0.7, raising=False)
            scores = model.get_normalized_probs(model(**net_input), log_probs=True)
    finally:
        with torch.no_grad():
            projection.bias.copy_(saved)
    assert (rows[:, 1:] > 0).all()  # the language rows are in play, not only row 0
    assert torch.allclose(scores, expected, atol=1e-5)


def test_a_counts_file_works_with_a_task_the_counter_does_not_know(data, tmp_path):
    """The refusal names --natbias-init file: taken, the model builds and its
    prior (the statistics', the criteria's) is the file's."""
    from fairseq.data import Dictionary
    from fairseq.tasks import FairseqTask

    from fairseq_natbias.training_data import criterion_prior

    class UnknownTask(FairseqTask):  # a user's own task: its targets are its business
        def __init__(self, cfg, dictionary):
            super().__init__(cfg)
            self.dictionary = dictionary

        source_dictionary = target_dictionary = property(lambda self: self.dictionary)

    from fairseq_natbias.transformer_natbias import TransformerNatbiasModel

    dictionary = Dictionary.load(str(data / "dict.de.txt"))
    unknown = UnknownTask(SimpleNamespace(data=str(data)), dictionary)
    _, stock_built, _ = build_in_process(data, tmp_path, "--task", "translation", "-s", "en",
                                         "-t", "de")  # fmt: skip
    args = SimpleNamespace(**{**vars(stock_built.natbias_args), "natbias_target_tokens": None})
    with pytest.raises(NaturalBiasError, match="--natbias-init file --natbias-counts PATH"):
        TransformerNatbiasModel.build_model(args, unknown)
    args.natbias_init, args.natbias_counts = "file", str(_counts_file(data, tmp_path))
    model = TransformerNatbiasModel.build_model(args, unknown)
    file_prior = _reference([data / "pieces/train.de"], dictionary)
    assert torch.allclose(model.target_log_unigram, file_prior, atol=1e-5)
    assert torch.equal(model.decoder.output_projection.bias.detach(), model.target_log_unigram)
    assert torch.equal(criterion_prior(unknown, model, "train", "c"), model.target_log_unigram)


def test_a_counts_file_of_dict_txt_counts_the_language_tokens_as_the_task_feeds_them(
    data, tmp_path
):
    """natbias-count --dict dict.de.txt knows no language token, which the task
    puts first in every target: each of the file's sentences (its EOS count)
    gives one, split between de and fr. Nothing is counted from the task (its
    training split is gone). At update 0 each sentence's first target costs
    what that prior says (0.05 bits), far less than 1/(N+|V|) did."""
    copy = tmp_path / "data"
    shutil.copytree(data, copy, ignore=shutil.ignore_patterns("train.*"))
    file = _counts_file(data, tmp_path)
    options = [*ONE_TO_MANY, *LANGTOKS, "--natbias-init", "file", "--natbias-counts", file]
    task, model, _ = build(copy, tmp_path, *options)
    dictionary, text = task.target_dictionary, data / "pieces/train.de"
    sentences = len(text.read_text(encoding="utf-8").splitlines())
    tokens = [task.data_manager.get_decoder_langtok(t, "tgt") for t in ("de", "fr")]
    expected = _reference([text], dictionary, {t: sentences / 2 for t in tokens})
    assert torch.allclose(model.target_log_unigram, expected, atol=1e-5)
    zero = _reference([text], dictionary)  # the language tokens at 0: 1/(N+|V|)
    assert math.isclose(zero[tokens[0]].exp(), 1 / (16273 + len(dictionary)), rel_tol=1e-3)
    priors = {where: {"now": expected, "zero": zero} for where in ("langtok", "de", "fr")}
    bits = step0_bits(task, model, priors)
    first = bits["langtok"]
    assert abs(first["model"] - first["now"]) < 0.05, bits
    assert first["zero"] - first["model"] > 5, bits  # the cost of the language tokens at 0


REFUSALS = {
    "a pair missing from the data": (
        ["--lang-pairs", "en-de,de-fr", *LANGTOKS],
        "no binarised target training split (looked for",
    ),
    "per-language without a language token": (
        [*ONE_TO_MANY, "--natbias-prior", "per-language"],
        "the decoder is not told which of ['de', 'fr'] to write: add --decoder-langtok",
    ),
    "per-language with a counts file": (
        [
            *ONE_TO_MANY,
            *LANGTOKS,
            "--natbias-prior",
            "per-language",
            "--natbias-init",
            "file",
            "--natbias-counts",
            "x.counts",
        ],  # fmt: skip
        "--natbias-prior per-language: --natbias-order 2, --natbias-init file and none have no row",
    ),
    "order 2": ([*ONE_TO_MANY, *LANGTOKS, "--natbias-order", "2"], "use --natbias-order 1"),
}


@pytest.mark.parametrize("case", REFUSALS, ids=list(REFUSALS))
def test_bad_input_is_refused_in_one_line_and_nothing_is_written(data, tmp_path, case):
    options, message = REFUSALS[case]
    argv = [data, "--user-dir", "fairseq_natbias", "--arch", "transformer_natbias"]
    argv += [*TINY_MODEL, *TINY_TRAINING, "--save-dir", tmp_path / "ck", *task_args(*options)]
    result = fairseq("fairseq-train", *argv, check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    (line,) = [line for line in result.stderr.splitlines() if "error:" in line]
    assert line.startswith("fairseq-train: error: ") and message in line, line
    assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").iterdir())


@pytest.mark.parametrize(
    "options, rows",
    [([*ONE_TO_MANY, *LANGTOKS], 3), (["--lang-pairs", "de-en,fr-en", *LANGTOKS], 2),
     (ONE_TO_MANY, 1), ([*ONE_TO_MANY, *LANGTOKS, "--natbias-order", "2"], None)],
    ids=["one-to-many", "many-to-one", "no-langtok", "order-2"],
)  # fmt: skip
def test_the_default_is_a_row_per_target_language_where_the_decoder_is_told_it(
    data, tmp_path, options, rows
):
    """Where it cannot be (no language token, several targets), the default is
    one pooled prior, not an error; the saved setting says which was built."""
    if rows is None:  # order 2 falls back to pooled, which the multilingual task refuses
        with pytest.raises(NaturalBiasError, match="use --natbias-order 1"):
            build(data, tmp_path, *options)
        return
    _, model, _ = build(data, tmp_path, *options)
    bias = model.decoder.output_projection.bias
    assert (bias.shape[0] if bias.dim() == 2 else 1) == rows
    assert model.natbias_args.natbias_prior == ("pooled" if rows == 1 else "per-language")


@pytest.mark.parametrize(
    "option", ["--extra-data={'mono_dae': '/nowhere'}", "--extra-lang-pairs={'mono_dae': 'en-en'}"]
)
def test_extra_data_is_refused_in_one_line(data, tmp_path, option):
    """docs/options.md: the natural bias counts the main data of --lang-pairs only."""
    with pytest.raises(NaturalBiasError) as refusal:
        build(data, tmp_path, *ONE_TO_MANY, *LANGTOKS, option)
    message = str(refusal.value)
    assert "\n" not in message
    assert message.startswith(
        "the natural bias counts the main data of --lang-pairs; --extra-data and "
        "--extra-lang-pairs are not counted: drop them"
    )


def test_per_language_needs_a_task_with_target_languages(toy_bin, toy_lm_bin, tmp_path):
    per_language = ["--natbias-prior", "per-language"]
    with pytest.raises(NaturalBiasError, match="it needs a multilingual task"):
        build_in_process(toy_bin, tmp_path, *per_language)
    with pytest.raises(NaturalBiasError, match="not LanguageModelingTask"):
        build_in_process(
            toy_lm_bin, tmp_path, "--task", "language_modeling", *per_language,
            arch="transformer_lm_natbias", model=TINY_LM + TINY_LM_TRAINING[:4],
        )  # fmt: skip


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    """A per-language one-to-many model trained 12 updates, then resumed to 16."""
    save = tmp_path_factory.mktemp("trained")
    argv = [data, "--user-dir", "fairseq_natbias", "--arch", "transformer_natbias"]
    argv += [*TINY_MODEL, *TINY_TRAINING, "--save-dir", save, "--share-all-embeddings"]
    argv += [*task_args(*ONE_TO_MANY, *LANGTOKS), "--natbias-prior", "per-language"]
    argv += ["--save-interval-updates", "6", "--keep-interval-updates", "3"]
    first = fairseq("fairseq-train", *argv, "--max-update", "12")
    resumed = fairseq("fairseq-train", *argv, "--max-update", "16")
    return save, first.stdout + first.stderr, resumed.stdout + resumed.stderr


def _bias_kl_and_norm_by_hand(bias, log_prior):
    """The mean over the rows of KL(softmax(b[r]) || p[r]) in bits and of |b[r]|, float64."""
    bias, log_prior = np.asarray(bias, np.float64), np.asarray(log_prior, np.float64)
    top = bias.max(1, keepdims=True)
    log_b = bias - top - np.log(np.exp(bias - top).sum(1, keepdims=True))  # log softmax
    kl_bits = (np.exp(log_b) * (log_b - log_prior)).sum(1) / math.log(2)
    return kl_bits.mean(), np.linalg.norm(bias, axis=1).mean()


@pytest.mark.training
def test_per_language_bias_kl_and_bias_norm_are_the_rows_mean_by_hand(trained):
    """The last log line of the resumed run (update 16, the saved model):
    bias_kl and bias_norm, means over the rows (pooled, de, fr), computed here
    from the checkpoint, to the 4 decimals fairseq logs them with."""
    save, _, resumed = trained
    state = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    bias = state["model"]["decoder.output_projection.bias"]
    log_prior = state["model"]["target_log_unigram"]
    assert bias.shape == log_prior.shape and len(bias) == 3  # pooled, de, fr
    kl, norm = _bias_kl_and_norm_by_hand(bias, log_prior)
    (last,) = [r for r in log_records(resumed) if r["num_updates"] == 16]
    assert last["bias_kl"] == pytest.approx(kl, abs=0.5e-4 + 1e-5 * kl)
    assert last["bias_norm"] == pytest.approx(norm, abs=0.5e-4 + 1e-5 * norm)


def test_per_language_bias_kl_and_bias_norm_with_b_off_the_prior(per_language):
    """16 updates leave b at its prior (bias_kl 7e-6 bits); with each row
    moved off it by a ramp of its own, the logged statistics (the logging
    hook's) are the rows' means computed here."""
    from fairseq_natbias.logging_hook import BiasDivergenceHook

    _, model, _ = per_language
    model = copy.deepcopy(model)
    bias = model.decoder.output_projection.bias
    with torch.no_grad():
        ramp = torch.linspace(-1.0, 1.0, bias.shape[-1])
        bias += torch.stack([ramp * (r + 1) for r in range(len(bias))])
    stats = BiasDivergenceHook(model, stats_interval=1).bias_statistics()
    kl, norm = _bias_kl_and_norm_by_hand(bias.detach(), model.target_log_unigram)
    assert kl > 0.1  # the rows are off their priors
    assert stats["bias_kl"] == pytest.approx(kl, rel=1e-5)
    assert stats["bias_norm"] == pytest.approx(norm, rel=1e-5)


def _generate(data, path, target, *extra):
    result = fairseq(
        "fairseq-generate", data, "--user-dir", "fairseq_natbias", "--path", path,
        *task_args(*ONE_TO_MANY, *LANGTOKS), "--source-lang", "en", "--target-lang", target,
        "--gen-subset", "test", "--beam", "2", "--max-len-b", "8", "--batch-size", "32",
        "--cpu", "--required-batch-size-multiple", "1", *NO_LOADER_PROCESS, *extra,
    )  # fmt: skip
    return [line for line in result.stdout.splitlines() if line.startswith("H-")]


@pytest.mark.training
def test_it_trains_resumes_and_generates_each_direction(data, trained):
    save, first, resumed = trained
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ 12 updates\)", resumed)
    assert "num_updates 16" in resumed
    assert "bias_kl" in first and "kl_unigram" in first
    de, fr = (_generate(data, save / "checkpoint_last.pt", lang) for lang in ("de", "fr"))
    assert len(de) == len(fr) == 100 and de != fr


@pytest.mark.training
def test_averaged_and_ensembled_checkpoints_generate(data, trained, tmp_path):
    save = trained[0]
    averaged = tmp_path / "averaged.pt"
    fairseq("natbias-average-checkpoints", "--inputs", save, "--num-update-checkpoints", "2",
            "--output", averaged)  # fmt: skip
    # each tensor (the bias's three rows too) the mean of the last two update
    # checkpoints', in float64 and rounded to float32 once: within |mean| 2^-24
    inputs = sorted(save.glob("checkpoint_*_*.pt"), key=lambda p: int(p.stem.split("_")[-1]))
    newest, older = (torch.load(p, map_location="cpu")["model"] for p in inputs[-1:-3:-1])
    mean = torch.load(averaged, map_location="cpu")["model"]
    assert mean.keys() == newest.keys() and mean["decoder.output_projection.bias"].shape[0] == 3
    for name, tensor in mean.items():
        if tensor.is_floating_point():
            exact = (newest[name].double() + older[name].double()) / 2
            torch.testing.assert_close(tensor.double(), exact, rtol=2**-24, atol=0, msg=name)
    bias = "decoder.output_projection.bias"
    assert ((newest[bias] - older[bias]).abs().amax(1) > 0).all()  # each row a real average
    assert len(_generate(data, averaged, "de")) == 100
    (twelve,) = save.glob("checkpoint_*_12.pt")
    ensemble = f"{twelve}:{save / 'checkpoint_last.pt'}"
    assert len(_generate(data, ensemble, "fr")) == 100


@pytest.mark.training
def test_ctranslate2_refuses_a_per_language_prior_in_one_line(data, trained, tmp_path):
    from natbias.ct2_converter import main

    arguments = ["--model_path", trained[0] / "checkpoint_last.pt", "--data_dir", data]
    with pytest.raises(SystemExit) as stop:
        main([*map(str, arguments), "--output_dir", str(tmp_path / "ct2")])
    assert str(stop.value).startswith("natbias-ct2-converter: error: ")
    assert "one bias row per target language" in str(stop.value) and "\n" not in str(stop.value)
    assert not (tmp_path / "ct2").exists()
