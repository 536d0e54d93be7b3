"""SentencePiece on raw text, as fairseq-preprocess reads it: a unigram model over
all the given files (joint for two languages), every character kept, fewer
pieces than asked for where a small corpus has no more."""

import os
from pathlib import Path

from natbias.counts import open_text


def train(
    files,
    model_prefix,
    vocab_size,
    keep_sentencepiece_specials=False,
    threads=None,
    max_sentences=None,
    log_level=2,
):
    """Train ``<model_prefix>.model`` on ``files``. fairseq's dictionary adds its
    own <s>, </s> and <pad>, so only <unk> is reserved unless
    ``keep_sentencepiece_specials``; ``max_sentences`` samples that many lines."""
    import sentencepiece

    options = dict(
        input=",".join(map(str, files)),
        model_prefix=str(model_prefix),
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        hard_vocab_limit=False,
        minloglevel=log_level,
    )
    if not keep_sentencepiece_specials:
        options.update(bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0)
    if threads:
        options.update(num_threads=threads)
    if max_sentences:
        options.update(input_sentence_size=max_sentences, shuffle_input_sentence=True)
    sentencepiece.SentencePieceTrainer.train(**options)


def load(model_file):
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=str(model_file))


def encode_lines(processor, lines):
    """Each line, stripped, as space-separated pieces; ``processor`` from :func:`load`."""
    return [" ".join(processor.encode(line.strip(), out_type=str)) for line in lines]


def encode_files(model_file, files, output_dir):
    """Each file (plain or .gz) encoded into ``output_dir`` under its name (without .gz)."""
    processor = load(model_file)
    os.makedirs(output_dir, exist_ok=True)
    for path in map(str, files):
        with open_text(path) as source:
            pieces = encode_lines(processor, source)
        name = Path(path).name.removesuffix(".gz")
        with open(Path(output_dir) / name, "w", encoding="utf-8") as out:
            out.writelines(line + "\n" for line in pieces)
