"""The tests' shared fixtures (tests/ and research/tests/ alike): data made and
binarised once per test session, also when `make test` spreads the modules
over several pytest-xdist workers. Each folder's conftest.py imports them."""

import gzip
import os
import random
import shutil

import pytest
import torch
from filelock import FileLock
from natbias_testing import MULTI30K, fairseq, skip_without_data

# One thread per pytest worker (make test runs one worker per core), for the
# fairseq runs in this process as for the subprocesses (OMP_NUM_THREADS=1).
torch.set_num_threads(1)


def built_once(tmp_path_factory, name, build):
    """The folder ``name`` made by ``build(folder)`` once per test session.

    Each xdist worker runs its own session fixtures, and tests/ and
    research/tests/ each register them (their conftest.py files), so each
    would binarise the same data again (a fairseq process, ~7 CPU-s to
    start): the first builds it in the run's temp folder under a lock, the
    others wait for it and reuse it. Nothing writes to it afterwards (tests
    that delete files work on ``fresh_copy``)."""
    base = tmp_path_factory.getbasetemp()
    run = base.parent if "PYTEST_XDIST_WORKER" in os.environ else base  # gw0, gw1, ... share it
    folder = run / name
    with FileLock(f"{folder}.lock"):
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)  # a worker that died mid-build
            folder.mkdir()
            build(folder)
            (folder / ".built").touch()
    return folder


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _synthetic_pairs(n, seed, src_vocab, tgt_vocab):
    """Zipf-ish toy parallel text: source and target use different words."""
    rng = random.Random(seed)
    src_words = [f"s{i}" for i in range(src_vocab)]
    tgt_words = [f"t{i}" for i in range(tgt_vocab)]
    src_weights = [1.0 / (i + 1) for i in range(src_vocab)]
    tgt_weights = [1.0 / (i + 1) for i in range(tgt_vocab)]
    pairs = []
    for _ in range(n):
        length = rng.randint(3, 9)
        src = rng.choices(src_words, src_weights, k=length)
        tgt = rng.choices(tgt_words, tgt_weights, k=length + rng.randint(-1, 1))
        pairs.append((" ".join(src), " ".join(tgt)))
    return pairs


@pytest.fixture(scope="session")
def toy_text(tmp_path_factory):
    """Toy parallel text, src/tgt with disjoint vocabularies."""
    root = tmp_path_factory.mktemp("toy_text")
    for split, n, seed in (("train", 400, 1), ("valid", 40, 2), ("test", 20, 3)):
        pairs = _synthetic_pairs(n, seed, src_vocab=40, tgt_vocab=30)
        _write(root / f"{split}.src", [p[0] for p in pairs])
        _write(root / f"{split}.tgt", [p[1] for p in pairs])
    return root  # seeded: every worker writes the same text


def preprocess(text_dir, dest, joined=False, src="src", tgt="tgt"):
    args = [
        "--source-lang",
        src,
        "--target-lang",
        tgt,
        "--trainpref",
        text_dir / "train",
        "--validpref",
        text_dir / "valid",
        "--testpref",
        text_dir / "test",
        "--destdir",
        dest,
        "--workers",
        "1",
    ]
    if joined:
        args.append("--joined-dictionary")
    fairseq("fairseq-preprocess", *args)
    return dest


@pytest.fixture(scope="session")
def toy_bin(tmp_path_factory, toy_text):
    """Binarised toy data with separate dictionaries."""
    return built_once(tmp_path_factory, "toy_bin", lambda dest: preprocess(toy_text, dest))


@pytest.fixture(scope="session")
def toy_bin_joined(tmp_path_factory, toy_text):
    """Binarised toy data with one joined dictionary (source words included)."""
    return built_once(
        tmp_path_factory, "toy_bin_joined", lambda dest: preprocess(toy_text, dest, joined=True)
    )


@pytest.fixture
def fresh_copy(tmp_path):
    """Copy a data directory so a test may delete files from it."""

    def copy(data_dir):
        target = tmp_path / "data"
        shutil.copytree(data_dir, target)
        return target

    return copy


# --- real text: Multi30k German-English with a real SentencePiece model --------


@pytest.fixture(scope="session")
def multi30k_text(tmp_path_factory):
    """Multi30k De-En encoded with a joint 8k SentencePiece model: all 29,000
    training pairs, the first EVAL_SENTENCES of val and test_2016_flickr."""
    if not (MULTI30K / "train.de.gz").exists():
        skip_without_data(f"Multi30k not found at {MULTI30K} (set NATBIAS_MULTI30K)")
    return built_once(tmp_path_factory, "multi30k_text", encode_multi30k)


# Scoring a split costs (tokens x 8,000) logits; the checks on it (a fresh
# model within 0.3 bits of the unigram, the fp16 runs' validation) need a few
# thousand target tokens, not Multi30k's whole 1,014 + 1,000 sentences: 300
# sentences (about 4,000 target pieces) make those tests 3x cheaper.
EVAL_SENTENCES = 300


def encode_multi30k(root):
    import sentencepiece as spm

    raw = {}
    for split, name in (("train", "train"), ("valid", "val"), ("test", "test_2016_flickr")):
        for lang in ("de", "en"):
            with gzip.open(MULTI30K / f"{name}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [line.strip() for line in f]
            raw[split, lang] = lines if split == "train" else lines[:EVAL_SENTENCES]
            _write(root / f"{split}.raw.{lang}", raw[split, lang])
    spm.SentencePieceTrainer.train(
        input=f"{root}/train.raw.de,{root}/train.raw.en",
        model_prefix=str(root / "spm"),
        vocab_size=8000,
        model_type="unigram",
        character_coverage=1.0,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        unk_id=0,
        minloglevel=2,
        num_threads=2,
    )
    model = spm.SentencePieceProcessor(model_file=str(root / "spm.model"))
    for (split, lang), lines in raw.items():
        _write(
            root / f"{split}.{lang}", [" ".join(model.encode(line, out_type=str)) for line in lines]
        )


@pytest.fixture(scope="session")
def multi30k_bin(tmp_path_factory, multi30k_text):
    """Multi30k De-En, joint SentencePiece, joined dictionary, binarised."""
    return built_once(
        tmp_path_factory,
        "multi30k_bin",
        lambda dest: preprocess(multi30k_text, dest, joined=True, src="de", tgt="en"),
    )


@pytest.fixture(scope="session")
def lsce_run(tmp_path_factory, toy_bin):
    """fairseq-train's stdout: transformer_natbias (unigram bias) trained with
    the stock label_smoothed_cross_entropy for 2 updates, logging every update."""
    from natbias_testing import train

    return train(toy_bin, tmp_path_factory.mktemp("lsce_run"), "--no-save", max_update=2).stdout


@pytest.fixture(scope="session")
def toy_log_unigram(toy_text, toy_bin):
    """log omega of the toy training targets, counted in the tests (float64)."""
    from fairseq.data import Dictionary
    from natbias_testing import reference_log_unigram

    return reference_log_unigram(
        toy_text / "train.tgt", Dictionary.load(str(toy_bin / "dict.tgt.txt"))
    )


# --- language modelling: fairseq-preprocess --only-source -------------------------


def preprocess_lm(text_dir, dest, lang):
    """``text_dir/{train,valid,test}.LANG`` binarised for --task language_modeling."""
    fairseq(
        "fairseq-preprocess",
        "--only-source",
        "--trainpref",
        text_dir / f"train.{lang}",
        "--validpref",
        text_dir / f"valid.{lang}",
        "--testpref",
        text_dir / f"test.{lang}",
        "--destdir",
        dest,
        "--workers",
        "1",
    )
    return dest


@pytest.fixture(scope="session")
def toy_lm_bin(tmp_path_factory, toy_text):
    """The toy corpus's target side as language-model data."""
    return built_once(
        tmp_path_factory, "toy_lm_bin", lambda dest: preprocess_lm(toy_text, dest, "tgt")
    )


@pytest.fixture(scope="session")
def multi30k_lm_bin(tmp_path_factory, multi30k_text):
    """Multi30k English (the joint SentencePiece pieces) as language-model data."""
    return built_once(
        tmp_path_factory, "multi30k_lm_bin", lambda dest: preprocess_lm(multi30k_text, dest, "en")
    )
