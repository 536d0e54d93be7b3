"""natbias/tools/sentencepiece_text.py: the one SentencePiece trainer and
encoder, on Multi30k's German and English (a joint model, as the demo and the
recipes train it), checked against what SentencePiece's own processor says."""

import gzip

import pytest
import sentencepiece
from natbias_testing import write_multi30k_slice

from natbias.tools import sentencepiece_text

WORD_BOUNDARY = "\u2581"  # SentencePiece's "▁", a space before the piece


def detokenised(pieces):
    return "".join(pieces.split()).replace(WORD_BOUNDARY, " ").strip()


@pytest.fixture(scope="module")
def joint(tmp_path_factory):
    """A joint 800-piece model on 2,000 German and English training lines."""
    root = write_multi30k_slice(tmp_path_factory.mktemp("spm"), {"train": 2000, "val": 50})
    sentencepiece_text.train([root / "train.de", root / "train.en"], root / "joint", 800)
    return root


def test_joint_model_reserves_only_unk_by_default(joint):
    """fairseq's dictionary adds <s>, <pad>, </s>: SentencePiece keeps <unk> only."""
    processor = sentencepiece.SentencePieceProcessor(model_file=str(joint / "joint.model"))
    assert processor.unk_id() == 0
    assert (processor.bos_id(), processor.eos_id(), processor.pad_id()) == (-1, -1, -1)
    assert processor.get_piece_size() == 800
    # Joint: pieces of both languages' frequent words.
    vocabulary = {processor.id_to_piece(i) for i in range(processor.get_piece_size())}
    assert {WORD_BOUNDARY + "ein", WORD_BOUNDARY + "a"} <= vocabulary


def test_keep_sentencepiece_specials(joint, tmp_path):
    """The recipes' models keep SentencePiece's own <s> (1) and </s> (2)."""
    sentencepiece_text.train(
        [joint / "train.en"],
        tmp_path / "kept",
        300,
        keep_sentencepiece_specials=True,
        threads=1,
        max_sentences=500,
    )
    processor = sentencepiece_text.load(tmp_path / "kept.model")
    assert (processor.unk_id(), processor.bos_id(), processor.eos_id()) == (0, 1, 2)


def test_encode_lines_is_the_processors_encoding_and_detokenises_back(joint):
    processor = sentencepiece_text.load(joint / "joint.model")
    lines = (joint / "val.de").read_text(encoding="utf-8").splitlines()
    encoded = sentencepiece_text.encode_lines(processor, ["  " + line + " \n" for line in lines])
    assert encoded == [" ".join(processor.encode(line, out_type=str)) for line in lines]
    assert [detokenised(pieces) for pieces in encoded] == [" ".join(line.split()) for line in lines]


def test_encode_files_reads_gzip_names_outputs_without_gz_and_loads_once(
    joint, tmp_path, monkeypatch
):
    german = (joint / "val.de").read_text(encoding="utf-8")
    with gzip.open(tmp_path / "val.de.gz", "wt", encoding="utf-8") as f:
        f.write(german)
    loads = []
    real_load = sentencepiece_text.load
    monkeypatch.setattr(sentencepiece_text, "load", lambda m: loads.append(m) or real_load(m))
    sentencepiece_text.encode_files(
        joint / "joint.model", [tmp_path / "val.de.gz", joint / "val.en"], tmp_path / "out"
    )
    assert loads == [joint / "joint.model"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["val.de", "val.en"]
    processor = real_load(joint / "joint.model")
    for name, text in (
        ("val.de", german),
        ("val.en", (joint / "val.en").read_text(encoding="utf-8")),
    ):
        expected = sentencepiece_text.encode_lines(processor, text.splitlines())
        assert (tmp_path / "out" / name).read_text(encoding="utf-8").splitlines() == expected
