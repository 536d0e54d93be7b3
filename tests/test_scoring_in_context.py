"""The frequency tools' scoring (fairseq_natbias.scoring, natbias.hf.scoring)
on models that read their context: each token's log-probability the tools
use (natbias-loss-by-frequency's and natbias-frequency-bias's) against the
same token scored here one sentence at a time, in float64. On the same
models, what else reads positions and padding: fairseq-generate's lambda and
tau (b trained off log p), fairseq-validate's and transformers' logged
divergences (the logging hook, natbias.hf.callback's probe).

The text is a chain: each target word is the previous one plus 1 (three
times in four) or 2, modulo 20; the source spells the same chain in its own
words. A model trained on it predicts a token from the one before (the
language models) and from the source (the translation model), so a scorer
that pairs a token with the wrong position, the wrong source or a padding
position gives other numbers here, where the unigram and uniform models of
tests/test_frequency_tools.py give the same ones at every position."""

import csv
import json
import math
import random
import shutil
from collections import Counter

import numpy as np
import pytest
import torch
from natbias_fixtures import preprocess
from natbias_testing import load_fairseq_model, train, train_lm

from natbias.tools import frequency

WORDS = 20  # t0 .. t19 (target), s0 .. s19 (source)
LN2 = math.log(2)


def chain_lines(n, seed):
    """``n`` (source, target) lines: a chain of 2 to 10 words."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        word = rng.randrange(WORDS)
        chain = [word]
        for _ in range(rng.randint(1, 9)):
            word = (word + rng.choice((1, 1, 1, 2))) % WORDS
            chain.append(word)
        pairs.append((" ".join(f"s{w}" for w in chain), " ".join(f"t{w}" for w in chain)))
    return pairs


@pytest.fixture(scope="module")
def chain_text(tmp_path_factory):
    root = tmp_path_factory.mktemp("chain_text")
    for split, n, seed in (("train", 1000, 1), ("valid", 10, 2), ("test", 40, 3)):
        pairs = chain_lines(n, seed)
        (root / f"{split}.src").write_text("".join(s + "\n" for s, _ in pairs))
        (root / f"{split}.tgt").write_text("".join(t + "\n" for _, t in pairs))
    return root


def lines(path):
    return path.read_text().splitlines()


# Sixty updates take the translation model to 0.16 nats a test token (the
# unigram: 3.0; the chain given its source: 0), the language model to 1.30
# (the chain's own entropy, its first words and lengths included: 1.14).
TRAINING = ("--disable-validation", "--save-interval", "1000", "--dropout", "0", "--lr", "3e-3")
TRAINING += ("--max-tokens", "1000", "--log-interval", "100")


def without_context(checkpoint, out):
    """The checkpoint with W = 0: it predicts b at every position (the baseline)."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    for key in ("decoder.output_projection.weight", "decoder.embed_tokens.weight"):
        state["model"][key].zero_()
    torch.save(state, out)
    return out


@pytest.fixture(scope="module")
def chain_bin(chain_text, tmp_path_factory):
    """The chains binarised for translation, and their target side for
    language modelling: the same files under the names --task
    language_modeling reads (one fairseq-preprocess, not two)."""
    root = tmp_path_factory.mktemp("chain_bin")
    data = preprocess(chain_text, root / "mt")
    (root / "lm").mkdir()
    shutil.copy(data / "dict.tgt.txt", root / "lm" / "dict.txt")
    for split in ("train", "valid", "test"):
        for suffix in ("bin", "idx"):
            (root / "lm" / f"{split}.{suffix}").symlink_to(data / f"{split}.src-tgt.tgt.{suffix}")
    return data, root / "lm"


@pytest.fixture(scope="module")
def translation(chain_bin, tmp_path_factory):
    root = tmp_path_factory.mktemp("chain_mt")
    train(chain_bin[0], root / "run", *TRAINING, max_update=60)
    model = root / "run" / "checkpoint_last.pt"
    return chain_bin[0], without_context(model, root / "baseline.pt"), model


@pytest.fixture(scope="module")
def language_model(chain_bin, tmp_path_factory):
    root = tmp_path_factory.mktemp("chain_lm")
    train_lm(chain_bin[1], root / "run", *TRAINING, max_update=60)
    model = root / "run" / "checkpoint_last.pt"
    return chain_bin[1], without_context(model, root / "baseline.pt"), model


# --- scored here: one sentence at a time, the model in float64 --------------------


def fairseq_double(checkpoint, data):
    model, task = load_fairseq_model(checkpoint, data)
    return model.double(), task


def translation_log_probs(model, task, pairs):
    """Per pair, (target ids, their log-probabilities, the distributions):
    fairseq's reading of a pair (source words + EOS; the target's words + EOS
    predicted after EOS), as the dictionaries map the words."""
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    scored = []
    with torch.no_grad():
        for source, target in pairs:
            src = [src_dict.index(w) for w in source.split()] + [src_dict.eos()]
            tgt = [tgt_dict.index(w) for w in target.split()] + [tgt_dict.eos()]
            logits = model(
                torch.tensor([src]),
                torch.tensor([len(src)]),
                torch.tensor([[tgt_dict.eos()] + tgt[:-1]]),
            )[0][0]
            scored.append(picked(tgt, logits))
    return scored


def picked(ids, logits):
    log_p = torch.log_softmax(logits.double(), -1)
    return np.array(ids), log_p[torch.arange(len(ids)), ids].numpy(), log_p.exp().numpy()


def lm_log_probs(model, dictionary, sequences, first):
    """Per sequence of ids, as ``picked``: each predicted after ``first`` (the
    token before it) and the ids before it."""
    with torch.no_grad():
        return [
            picked(ids, model(torch.tensor([[start, *ids[:-1]]]))[0][0])
            for ids, start in zip(sequences, first)
        ]


# The margin: the tools score in float32, this test in float64. float32
# rounds each operation by at most u = 2**-24 relative; a logit is made by
# sums of at most 128 terms (the feed-forward layer) in each of 2 layers, so
# its rounding is at most about (2 x 128) u |logit| (the classic n u bound of
# a sum, its terms the size of the sum: a trained model's are), and the
# log-softmax at most doubles it. |logit| <= the largest |log p| the test
# sees (the logits' differences are what log p holds), here about 10 nats:
# 3e-4. Measured: 3e-7 (the bound is a worst case). A break gives 0.1 to 10.
def margin(distributions):
    largest = max(float(np.abs(np.log(d)).max()) for d in distributions)
    return 2 * (2 * 128) * 2**-24 * largest


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def check_scores(scored, expected, names=("baseline", "model")):
    """``score_pair``'s output against the test's: ids exact, every log-probability
    and the average distribution within the rounding margin."""
    ids, lp_base, lp_model, _, averages = scored
    for name, lp, average, (exp_ids, exp_lp, exp_dist) in zip(
        names, (lp_base, lp_model), averages, expected
    ):
        assert np.array_equal(ids, exp_ids), name
        tolerance = margin([exp_dist])
        np.testing.assert_allclose(lp, exp_lp, atol=tolerance, rtol=0, err_msg=name)
        np.testing.assert_allclose(average, exp_dist.mean(0), atol=tolerance, rtol=0, err_msg=name)


def joined(scored):
    ids, lps, dists = zip(*scored)
    return np.concatenate(ids), np.concatenate(lps), np.concatenate(dists)


def reads_context(expected):
    """Nats a token lost where each token is read from the distribution one
    position before its own (a scorer off by one)."""
    ids, lp, distributions = expected
    return lp.mean() - np.log(distributions[np.arange(len(ids) - 1), ids[1:]]).mean()


def loss_args(*args):
    return frequency.loss_parser().parse_args([str(a) for a in args])


@pytest.mark.training
def test_translation_scores_are_each_sentence_scored_alone(translation, chain_text, tmp_path):
    from fairseq_natbias import scoring

    data, baseline, checkpoint = translation
    pairs = list(zip(lines(chain_text / "test.src"), lines(chain_text / "test.tgt")))
    # --max-tokens 40: the 40 test pairs in batches of a few, sorted by length, padded
    args = loss_args(
        baseline, checkpoint, "--data", data, "--cpu", "--max-tokens", 40, "--out-dir", tmp_path
    )
    scored = scoring.score_pair(args, lambda message: None)
    expected = []
    for path in (baseline, checkpoint):
        model, task = fairseq_double(path, data)
        expected.append(joined(translation_log_probs(model, task, pairs)))
    check_scores(scored, expected)
    assert reads_context(expected[1]) > 1.0
    # The model reads its source: each target scored with the next pair's source loses nats.
    shifted = [(pairs[(i + 1) % len(pairs)][0], t) for i, (_, t) in enumerate(pairs)]
    wrong = joined(translation_log_probs(model, task, shifted))[1]
    assert expected[1][1].mean() - wrong.mean() > 1.0


def stream_blocks(dictionary, text_lines, block=32):
    """fairseq's language_modeling reading of a split (--sample-break-mode
    none, --tokens-per-sample ``block``): the lines' ids, each line closed by
    EOS, as one stream cut every ``block`` tokens; each block's tokens
    predicted after the stream's token before it (EOS before the first)."""
    stream = [dictionary.index(w) for line in text_lines for w in line.split() + ["</s>"]]
    before = [dictionary.eos(), *stream[:-1]]
    starts = range(0, len(stream), block)
    return [stream[s : s + block] for s in starts], [before[s] for s in starts]


@pytest.mark.training
def test_language_model_scores_are_each_block_scored_alone(language_model, chain_text, tmp_path):
    from fairseq_natbias import scoring

    data, baseline, checkpoint = language_model
    text_lines = lines(chain_text / "test.tgt")
    # --max-tokens 64: the test split's blocks two at a time, the short last one padded
    args = loss_args(
        baseline, checkpoint, "--data", data, "--cpu", "--max-tokens", 64, "--out-dir", tmp_path
    )
    scored = scoring.score_pair(args, lambda message: None)
    expected = []
    for path in (baseline, checkpoint):
        model, task = fairseq_double(path, data)
        blocks, first = stream_blocks(task.target_dictionary, text_lines)
        assert len(blocks[-1]) < 32  # a block shorter than the rest: padding in its batch
        expected.append(joined(lm_log_probs(model, task.target_dictionary, blocks, first)))
    check_scores(scored, expected)
    assert reads_context(expected[1]) > 1.0


@pytest.mark.training
def test_fairseq_validate_logs_the_divergences_of_each_block_scored_alone(
    language_model, chain_text
):
    """fairseq-validate's kl_unigram and kl_uniform (the logging hook's, on
    the test split in batches of two blocks, the last padded) against each
    position's KL computed here from the blocks scored alone, in float64,
    and the prior counted from the text."""
    from natbias_testing import NO_LOADER_PROCESS, fairseq, log_records, reference_log_unigram

    data, _, checkpoint = language_model
    validated = fairseq(
        "fairseq-validate", *NO_LOADER_PROCESS, data, "--task", "language_modeling",
        "--user-dir", "fairseq_natbias", "--path", checkpoint, "--cpu", "--valid-subset", "test",
        "--max-tokens", "64", "--required-batch-size-multiple", "1",
    )  # fmt: skip
    logged = log_records(validated.stdout + validated.stderr, "test")[-1]  # tagged by subset
    model, task = fairseq_double(checkpoint, data)
    dictionary = task.target_dictionary
    blocks, first = stream_blocks(dictionary, lines(chain_text / "test.tgt"))
    _, _, p = joined(lm_log_probs(model, dictionary, blocks, first))
    log_u = reference_log_unigram(chain_text / "train.tgt", dictionary).numpy()
    expected = {
        "kl_unigram": (p * (np.log(p) - log_u)).sum(-1).mean() / LN2,
        "kl_uniform": (p * (np.log(p) + np.log(len(dictionary)))).sum(-1).mean() / LN2,
    }
    for key, value in expected.items():  # logged to 3 decimals; float32's rounding (margin)
        assert logged[key] == pytest.approx(value, abs=5e-4 + margin([p]) / LN2), key


def replacement_pairs(text_lines):
    """Each test line of three words or more, and it with its last word
    replaced by the word ten after it (a chain never takes that step)."""
    pairs = []
    for line in text_lines:
        words = line.split()
        if len(words) >= 3:
            other = f"t{(int(words[-1][1:]) + 10) % WORDS}"
            pairs.append((line, " ".join([*words[:-1], other])))
    return pairs


def check_sentence_scores(out_dir, pairs, sentence_log_prob):
    """natbias-frequency-bias's CSV: each pair's two log-probabilities against
    the sentences' tokens and closing EOS scored here, summed."""
    rows = {int(row["line"]): row for row in read_csv(out_dir / "frequency_bias.csv")}
    assert sorted(rows) == list(range(1, len(pairs) + 1))
    good, bad, largest = [], [], 0.0
    for number, (good_text, bad_text) in enumerate(pairs, start=1):
        for sentence, column, kept in (
            (good_text, "logprob_good", good),
            (bad_text, "logprob_bad", bad),
        ):
            _, lp, distributions = sentence_log_prob(sentence)
            kept.append((float(rows[number][column]), lp.sum()))
            largest = max(largest, margin([distributions]) * len(lp))  # a sum of len(lp) terms
    np.testing.assert_allclose(*zip(*good), atol=largest, rtol=0)
    np.testing.assert_allclose(*zip(*bad), atol=largest, rtol=0)
    # the model tells them apart: the good sentence is likelier in most pairs
    assert np.mean([g > b for (g, _), (b, _) in zip(good, bad)]) > 0.9


def frequency_bias(pairs, model, out_dir, *options):
    """natbias-frequency-bias (in process) on ``pairs``, written as the JSON
    lines it reads, with ``model`` (a checkpoint or a saved folder) and
    ``options``: its frequency_bias.csv in ``out_dir``."""
    path = out_dir / "pairs.jsonl"
    path.write_text(
        "".join(json.dumps({"sentence_good": g, "sentence_bad": b}) + "\n" for g, b in pairs)
    )
    options = [str(path), str(model), *map(str, options), "--cpu", "--out-dir", str(out_dir)]
    frequency.run_bias(frequency.bias_parser().parse_args(options))


@pytest.mark.training
def test_language_model_sentence_scores_are_each_sentence_scored_alone(
    language_model, chain_text, tmp_path
):
    data, _, checkpoint = language_model
    pairs = replacement_pairs(lines(chain_text / "test.tgt"))
    frequency_bias(
        pairs, checkpoint, tmp_path, "--data", data
    )  # 2 x len(pairs) in batches of 32, padded
    model, task = fairseq_double(checkpoint, data)
    dictionary = task.target_dictionary

    def sentence_log_prob(text):
        ids = [dictionary.index(w) for w in text.split()] + [dictionary.eos()]
        return lm_log_probs(model, dictionary, [ids], [dictionary.eos()])[0]

    check_sentence_scores(tmp_path, pairs, sentence_log_prob)


# --- fairseq-generate's lambda and tau on the trained translation model ---------------

LAMBDA, TAU = 0.5, 0.3


def greedy_search(model, tgt_dict, src, shift, max_len):
    """fairseq's beam-1 search redone here, one full forward a step (no
    incremental state): the likeliest token under log softmax(logits +
    ``shift``), padding never, EOS not first (--min-len 1) and forced after
    ``max_len`` tokens; (tokens, their log-probabilities, the distributions,
    the smallest gap between the chosen token and the next best)."""
    pad, eos = tgt_dict.pad(), tgt_dict.eos()
    tokens, scores, distributions, gaps = [], [], [], []
    for step in range(max_len + 1):
        prev = torch.tensor([[eos, *tokens]])
        logits = model(torch.tensor([src]), torch.tensor([len(src)]), prev)[0][0, -1]
        log_p = torch.log_softmax(logits.double() + shift, -1)
        allowed = log_p.clone()
        allowed[pad] = -math.inf
        if step == 0:
            allowed[eos] = -math.inf
        if step == max_len:
            token = eos
        else:
            best, second = allowed.topk(2).values.tolist()
            token, gap = int(allowed.argmax()), best - second
            gaps.append(gap)
        tokens.append(token)
        scores.append(float(log_p[token]))
        distributions.append(log_p.exp().numpy())
        if token == eos:
            break
    return tokens, np.array(scores), np.array(distributions), min(gaps)


LAMBDA, TAU = 0.5, 0.3


@pytest.mark.training
def test_fairseq_generate_applies_lambda_to_b_and_tau_to_the_log_unigram(translation, chain_text):
    """fairseq-generate's beam-1 search with --model-overrides lambda and
    tau: its hypotheses (H-) and their tokens' scores (P-, bits, 4 decimals)
    are the search redone here on log softmax(g W phi + lambda b - tau log p),
    with b the model's trained bias (no longer log p) and log p the add-1
    unigram counted from the text."""
    from natbias_testing import NO_LOADER_PROCESS, fairseq, reference_log_unigram

    data, _, checkpoint = translation
    overrides = f"{{'natbias_bias_scale': {LAMBDA}, 'natbias_logit_adjustment': {TAU}}}"
    output = fairseq(
        "fairseq-generate", *NO_LOADER_PROCESS, data, "--path", checkpoint,
        "--user-dir", "fairseq_natbias", "--beam", "1", "--batch-size", "16",
        "--required-batch-size-multiple", "1", "--max-len-a", "0", "--max-len-b", "12",
        "--model-overrides", overrides,
    ).stdout  # fmt: skip
    printed = {}
    for line in output.splitlines():
        kind, _, rest = line.partition("\t")
        if kind[:2] in ("H-", "P-"):
            printed.setdefault(int(kind[2:]), {})[kind[0]] = rest.split("\t")[-1]
    sources = lines(chain_text / "test.src")
    assert sorted(printed) == list(range(len(sources)))

    model, task = fairseq_double(checkpoint, data)
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    b = model.decoder.output_projection.bias.detach()
    log_p = reference_log_unigram(chain_text / "train.tgt", tgt_dict)
    shift = (LAMBDA - 1) * b - TAU * log_p  # g W phi + b  ->  g W phi + lambda b - tau log p
    wrong = (LAMBDA - 1 - TAU) * b  # tau applied to b
    with torch.no_grad():
        for i, source in enumerate(sources):
            src = [src_dict.index(w) for w in source.split()] + [src_dict.eos()]
            tokens, scores, distributions, gap = greedy_search(model, tgt_dict, src, shift, 12)
            # 4 decimals printed, and float32's rounding (margin, in bits)
            tolerance = 5e-5 + margin(distributions) / LN2
            assert gap > 2 * tolerance * LN2  # no near tie: float32 picks the same tokens
            assert printed[i]["H"] == tgt_dict.string(torch.tensor(tokens)), i
            np.testing.assert_allclose(
                [float(x) for x in printed[i]["P"].split()], scores / LN2, atol=tolerance, rtol=0
            )
            # trained, b is no longer log p: tau on b scores these tokens otherwise
            prev = torch.tensor([[tgt_dict.eos(), *tokens[:-1]]])
            logits = model(torch.tensor([src]), torch.tensor([len(src)]), prev)[0][0]
            other = picked(tokens, logits + wrong)[1] / LN2
            assert np.abs(other - scores / LN2).max() > 10 * tolerance


@pytest.mark.training
def test_fairseq_interactive_applies_lambda_and_tau_as_generate_does(translation, chain_text):
    """fairseq-interactive (the sentences on its standard input) with the
    same --model-overrides: each hypothesis the beam-1 search redone here."""
    import os
    import subprocess

    from natbias_testing import REPO, command_of, reference_log_unigram

    data, _, checkpoint = translation
    sources = lines(chain_text / "test.src")[:10]
    overrides = f"{{'natbias_bias_scale': {LAMBDA}, 'natbias_logit_adjustment': {TAU}}}"
    command = [
        *command_of("fairseq-interactive"), str(data), "--path", str(checkpoint),
        "--user-dir", "fairseq_natbias", "--source-lang", "src", "--target-lang", "tgt",
        "--beam", "1", "--max-len-a", "0", "--max-len-b", "12", "--cpu",
        "--model-overrides", overrides,
    ]  # fmt: skip
    result = subprocess.run(
        command, input="".join(s + "\n" for s in sources), capture_output=True, text=True,
        cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    printed = dict(
        line.split("\t")[0:3:2] for line in result.stdout.splitlines() if line.startswith("H-")
    )
    assert sorted(printed) == sorted(f"H-{i}" for i in range(len(sources)))
    model, task = fairseq_double(checkpoint, data)
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    b = model.decoder.output_projection.bias.detach()
    log_p = reference_log_unigram(chain_text / "train.tgt", tgt_dict)
    shift = (LAMBDA - 1) * b - TAU * log_p
    with torch.no_grad():
        for i, source in enumerate(sources):
            src = [src_dict.index(w) for w in source.split()] + [src_dict.eos()]
            tokens, _, distributions, gap = greedy_search(model, tgt_dict, src, shift, 12)
            assert gap > 2 * margin(distributions)  # no near tie: float32 picks the same tokens
            assert printed[f"H-{i}"] == tgt_dict.string(torch.tensor(tokens)), source


# --- transformers --------------------------------------------------------------------


def word_level_tokenizer(names):
    """Words split at spaces, each encoding closed by </s>."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    word_level = Tokenizer(models.WordLevel({w: i for i, w in enumerate(names)}, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    word_level.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", names.index("</s>"))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=word_level, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
        bos_token="<s>",
    )  # fmt: skip


def padded(sequences, value=0):
    return torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(s) for s in sequences], batch_first=True, padding_value=value
    )


@pytest.fixture(scope="module")
def transformers_models(chain_text, tmp_path_factory):
    """A natural-bias GPT-2 of hf_tiny's sizes trained here on the chains
    (each line's words and </s> after <s>), and it with W = 0 (the baseline)."""
    from hf_tiny import GPT_IDS, V, build

    from natbias.hf import add_natural_bias

    root = tmp_path_factory.mktemp("chain_hf")
    names = ["<pad>", "</s>", "<s>", "<unk>", *(f"t{i}" for i in range(WORDS))]
    names += [f"unused{i}" for i in range(len(names), V)]
    assert (names.index("</s>"), names.index("<s>")) == (
        GPT_IDS["eos_token_id"],
        GPT_IDS["bos_token_id"],
    )
    train_lines = lines(chain_text / "train.tgt")
    counts = Counter(w for line in train_lines for w in line.split() + ["</s>"])
    model = add_natural_bias(build("gpt2", seed=1), counts=[counts[n] for n in names])
    sequences = [[2] + [names.index(w) for w in line.split()] + [1] for line in train_lines]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(1)
    # 150 steps of 50 lines: 1.29 nats a test token, as fairseq's language model
    for _ in range(150):
        batch = padded([sequences[i] for i in torch.randint(len(sequences), (50,))])
        logits = model(input_ids=batch, attention_mask=batch.ne(0).long()).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten(), ignore_index=0
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(root / "model")
    tokenizer = word_level_tokenizer(names)
    tokenizer.save_pretrained(root / "model")
    with torch.no_grad():
        model.get_output_embeddings().weight.zero_()
    model.save_pretrained(root / "baseline")
    tokenizer.save_pretrained(root / "baseline")
    return root / "baseline", root / "model", names


def transformers_log_probs(folder, names, text_lines):
    """Per line, as ``picked``: its words and </s>, each predicted after <s> and the words before it."""
    from natbias.hf.scoring import load_causal_lm

    model, _ = load_causal_lm(str(folder))
    model = model.double()
    sequences = [[names.index(w) for w in line.split()] + [1] for line in text_lines]
    with torch.no_grad():
        return [
            picked(ids, model(input_ids=torch.tensor([[2, *ids[:-1]]])).logits[0])
            for ids in sequences
        ]


@pytest.mark.training
def test_transformers_scores_are_each_line_scored_alone(transformers_models, chain_text, tmp_path):
    from natbias.hf import scoring

    baseline, folder, names = transformers_models
    text = chain_text / "test.tgt"
    args = loss_args(
        baseline,
        folder,
        "--text",
        text,
        "--train-text",
        chain_text / "train.tgt",
        "--cpu",
        "--out-dir",
        tmp_path,
    )
    scored = scoring.score_pair(args, lambda message: None)  # 40 lines in batches of 16, padded
    expected = [
        joined(transformers_log_probs(path, names, lines(text))) for path in (baseline, folder)
    ]
    check_scores(scored, expected)
    assert reads_context(expected[1]) > 1.0


@pytest.mark.training
def test_transformers_sentence_scores_are_each_sentence_scored_alone(
    transformers_models, chain_text, tmp_path
):
    _, folder, names = transformers_models
    pairs = replacement_pairs(lines(chain_text / "test.tgt"))
    frequency_bias(
        pairs, folder, tmp_path, "--train-text", chain_text / "train.tgt"
    )  # batches of 16
    check_sentence_scores(
        tmp_path, pairs, lambda text: transformers_log_probs(folder, names, [text])[0]
    )


# --- transformers' logged statistics (natbias.hf.callback) ---------------------------


@pytest.mark.training
def test_logged_statistics_are_the_probes_divergences_computed_here(
    transformers_models, chain_text
):
    """kl_unigram and kl_uniform of a probe batch (as a collator makes it:
    right-padded, labels -100 at the padding), and bias_kl, bias_norm,
    weight_norm and gain, against float64 computations here: each line run
    alone, every real token after the first predicted from the positions
    before it (log2), the prior counted from the training text."""
    import copy

    from transformers import AutoModelForCausalLM

    from natbias.hf.callback import statistics

    _, folder, names = transformers_models
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    sequences = [
        [2] + [names.index(w) for w in line.split()] + [1]
        for line in lines(chain_text / "test.tgt")
    ]
    input_ids = padded(sequences)
    attention = input_ids.ne(0).long()
    probe = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "labels": input_ids.masked_fill(attention == 0, -100),
    }
    logged, unrounded = statistics(model, probe), statistics(model, probe, digits=None)

    counts = Counter(w for line in lines(chain_text / "train.tgt") for w in line.split() + ["</s>"])
    counts = np.array([counts[n] for n in names], dtype=np.float64)
    log_u = np.log((counts + 1) / (counts.sum() + len(names)))  # add-1, as the model was given
    double = copy.deepcopy(model).double()
    kl_unigram, kl_uniform, distributions = [], [], []
    with torch.no_grad():
        for ids in sequences:
            log_p = torch.log_softmax(
                double(input_ids=torch.tensor([ids])).logits[0, :-1], -1
            ).numpy()
            p = np.exp(log_p)
            kl_unigram += list((p * (log_p - log_u)).sum(-1))
            kl_uniform += list((p * (log_p + np.log(len(names)))).sum(-1))
            distributions.append(p)
    b = double.bias_in_logits().detach().numpy()
    log_b = b - np.logaddexp.reduce(b)
    gain = float(double.output_gain().detach())
    expected = {
        "kl_unigram": np.mean(kl_unigram) / LN2,
        "kl_uniform": np.mean(kl_uniform) / LN2,
        "bias_kl": (np.exp(log_b) * (log_b - log_u)).sum() / LN2,
        "bias_norm": np.linalg.norm(b),
        "weight_norm": np.linalg.norm(double.get_output_embeddings().weight.detach().numpy())
        * abs(gain),
        "gain": gain,
    }
    assert set(logged) == set(expected)
    # float32's rounding of a KL: its log-probabilities' (margin) and the sum
    # over the vocabulary (len(names) terms, each at most the largest |log p|)
    tolerance = margin(distributions) + len(names) * 2**-24 * max(
        np.abs(np.log(d)).max() for d in distributions
    )
    # the norms: float32 sums of at most 40 x 16 squares (W), relative error 640 u
    relative = 640 * 2**-24
    for key, value in expected.items():
        assert unrounded[key] == pytest.approx(value, abs=tolerance, rel=relative), key
        assert logged[key] == pytest.approx(value, abs=5e-5 + tolerance, rel=relative), (
            key
        )  # 4 decimals
    # the probe's positions matter: the model is far from the unigram after
    # the first token of a line, near it at the first
    assert expected["kl_unigram"] > 0.5
