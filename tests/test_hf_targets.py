"""add_natural_bias takes what a transformers Trainer is given as its
train_dataset (natbias.hf.targets): a 🤗 datasets Dataset and a streaming
IterableDataset built from local text files (load_dataset("text"), nothing
fetched) and tokenised by a tokenizer trained here, a list of dicts, torch
map-style and iterable datasets of dicts, and token-id lists; each counted as
a Counter counts the tokenizer's own output. Bad input is refused in one line
that names what was wrong and what to pass."""

import collections
import re

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

from hf_tiny import build  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # noqa: E402

from natbias.errors import NaturalBiasError  # noqa: E402
from natbias.hf import add_natural_bias, count_targets  # noqa: E402
from natbias.prior import log_unigram  # noqa: E402

WORDS = "a man woman dog child in on the street red blue plays runs sits with ball park".split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Two local text files, a word-level tokenizer trained on them (ids 0
    and 1: padding and unknown), and each line's ids as the tokenizer gives them."""
    root = tmp_path_factory.mktemp("text")
    rng = np.random.default_rng(0)
    weights = 1.0 / np.arange(1, len(WORDS) + 1)
    files = []
    for name, lines in (("a.txt", 120), ("b.txt", 80)):
        sentences = [
            " ".join(rng.choice(WORDS, size=rng.integers(2, 9), p=weights / weights.sum()))
            for _ in range(lines)
        ]
        (root / name).write_text("\n".join(sentences) + "\n", encoding="utf-8")
        files.append(str(root / name))
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train(files, trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>"]))
    lines = [line for path in files for line in open(path, encoding="utf-8").read().splitlines()]
    ids = [encoding.ids for encoding in tokenizer.encode_batch(lines)]
    return root, files, tokenizer, ids


def hand_counts(sequences, vocab_size, causal):
    counter = collections.Counter()
    for sequence in sequences:
        counter.update(sequence[1:] if causal else sequence)
    return np.array([counter[i] for i in range(vocab_size)])


def tokenise(tokenizer, labels=False):
    def batch(examples):
        ids = [e.ids for e in tokenizer.encode_batch(examples["text"])]
        if labels:  # a translation-like pair: the reversed line in, the line out
            return {"input_ids": [i[::-1] for i in ids], "labels": ids}
        return {"input_ids": ids}

    return batch


def text_dataset(corpus, streaming=False, labels=False):
    """As transformers' run_clm.py loads and tokenises its text files."""
    root, files, tokenizer, _ = corpus
    raw = datasets.load_dataset(
        "text", data_files={"train": files}, split="train", streaming=streaming,
        cache_dir=None if streaming else str(root / "cache"),
    )  # fmt: skip
    return raw.map(tokenise(tokenizer, labels), batched=True, remove_columns=["text"])


class MapStyle(torch.utils.data.Dataset):
    """A torch map-style dataset: __getitem__ and __len__, no __iter__."""

    def __init__(self, ids):
        self.ids = ids

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        return {"input_ids": torch.tensor(self.ids[index]), "attention_mask": None}


class Streamed(torch.utils.data.IterableDataset):
    def __init__(self, ids):
        self.ids = ids

    def __iter__(self):
        return ({"input_ids": ids} for ids in self.ids)


@pytest.fixture(scope="module")
def given(corpus):
    """Every kind of train_dataset, by name, with whether it has labels."""
    datasets.disable_progress_bars()
    ids = corpus[3]
    return {
        "datasets.Dataset": (text_dataset(corpus), False),
        "datasets.Dataset with labels, torch format": (
            text_dataset(corpus, labels=True).with_format("torch"),
            True,
        ),
        "datasets.IterableDataset (streaming)": (text_dataset(corpus, streaming=True), False),
        "streaming, with labels": (text_dataset(corpus, streaming=True, labels=True), True),
        "list of dicts": ([{"input_ids": i[::-1], "labels": i} for i in ids], True),
        "torch map-style Dataset": (MapStyle(ids), False),
        "torch IterableDataset": (Streamed(ids), False),
        "token-id lists": ((list(i) for i in ids), False),
    }


KINDS = [
    "datasets.Dataset",
    "datasets.Dataset with labels, torch format",
    "datasets.IterableDataset (streaming)",
    "streaming, with labels",
    "list of dicts",
    "torch map-style Dataset",
    "torch IterableDataset",
    "token-id lists",
]


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_of_train_dataset_counts_the_tokenizers_ids(corpus, given, kind):
    _, _, tokenizer, ids = corpus
    dataset, _ = given[kind]
    vocab = tokenizer.get_vocab_size()
    assert vocab == len(WORDS) + 2
    counted = count_targets(dataset, vocab, causal=True)
    np.testing.assert_array_equal(counted, hand_counts(ids, vocab, causal=True))
    assert counted.sum() > 500


@pytest.mark.parametrize("kind", ["datasets.Dataset", "streaming, with labels", "list of dicts"])
def test_a_model_takes_the_natural_bias_from_it(corpus, given, kind):
    """A decoder-only model counts each sequence from its second token, an
    encoder-decoder model all its labels."""
    _, _, tokenizer, ids = corpus
    vocab = tokenizer.get_vocab_size()
    dataset, _ = given[kind]
    for family, causal in (("gpt2", True), ("marian", False)):
        model = add_natural_bias(build(family, vocab_size=vocab), dataset)
        expected = log_unigram(hand_counts(ids, vocab, causal))
        torch.testing.assert_close(model.natbias_log_prior, expected, rtol=0, atol=1e-6)


def test_a_dataset_without_the_targets_column_names_its_columns(corpus):
    """Untokenised: a Dataset names its columns; a streaming one, whose
    columns are unknown until read, names its first example's keys."""
    root, files, _, _ = corpus
    for streaming in (False, True):
        raw = datasets.load_dataset(
            "text", data_files={"train": files}, split="train", streaming=streaming,
            cache_dir=str(root / "cache"),
        )  # fmt: skip
        with pytest.raises(NaturalBiasError, match=r"no 'labels' or 'input_ids'.*\['text'\]"):
            count_targets(raw, 20)


V = 40
SPLITS = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"input_ids": [[3]]})})
# Each bad input: what is given, and what the one line must say was wrong.
BAD = {
    "NaN counts": (dict(counts=[float("nan")] + [1.0] * (V - 1)), r"hold nan at entry 0"),
    "infinite counts": (dict(counts=[1.0] * (V - 1) + [float("inf")]), r"hold inf at entry 39"),
    "negative counts": (dict(counts=[3] * (V - 1) + [-2]), r"hold -2 at entry 39"),
    "text as counts": (dict(counts=["many"] * V), r"hold many at entry 0"),
    "a string of text": (dict(targets="train.en"), r"the targets are text \('train.en'\)"),
    "lines of text": (dict(targets=["a man plays"]), r"an example is text \('a man plays'\)"),
    "token strings": (dict(targets=[["a", "man", "plays"]]), r"holds text \(e.g. 'man'\)"),
    "float ids": (dict(targets=[[3, 4.5, 6]]), r"holds floats \(e.g. '4.5'\)"),
    "ragged nesting": (dict(targets=[[[3], [4, 5], [6]]]), r"lists of unequal lengths"),
    "one flat list of ids": (dict(targets=[3, 4, 5]), r"an example is the int 3"),
    "one dict of columns": (dict(targets={"input_ids": [[3, 4]]}), r"one dict \(keys"),
    "a DatasetDict": (dict(targets=SPLITS), r"\['train'\]\), not a dataset: pass one split"),
    "examples without ids": (dict(targets=[{"text": "a"}]), r"an example has no .*\['text'\]"),
    "a number": (dict(targets=7), r"the targets are of type int, not a dataset"),
}
WHAT_TO_PASS = (
    r"pass one finite count|pass a tokenised dataset|pass one (flat )?list of int ids"
    r"|pass its 'labels' or 'input_ids' list|pass one split, e.g. its \['train'\]"
    r"|tokenise the dataset first"
)


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_refused_in_one_line_naming_what_to_pass(case):
    given, wrong = BAD[case]
    with pytest.raises(NaturalBiasError, match=wrong) as error:
        add_natural_bias(build("gpt2"), **given)
    message = str(error.value)
    assert "\n" not in message
    assert re.search(WHAT_TO_PASS, message), message
