"""SentencePiece on raw text, as fairseq-preprocess reads it: one trainer and
one encoder for the demo and the study (:mod:`fairseq_natbias.pipeline`), the
examples (examples/translation/spm_text.py) and the recipes
(recipes/natbias_tools.py), which differ only in the options they pass.

A unigram model over all the given files (joint when they hold two
languages), keeping every character seen (European and African
Latin-script text) and taking fewer pieces than asked for where a small
corpus has no more (``hard_vocab_limit=False``).
"""

import os
from pathlib import Path

from fairseq_natbias.data_fetch import open_text


def train(files, model_prefix, vocab_size, keep_sentencepiece_specials=False, threads=None,
          max_sentences=None, log_level=2):
    """Train ``<model_prefix>.model`` on ``files``.

    fairseq's dictionary adds its own <s>, </s> and <pad>, so by default
    SentencePiece reserves only <unk> (id 0); ``keep_sentencepiece_specials``
    keeps its own <s> and </s> as well (the recipes' models, so that their
    vocabularies stay as they were). ``max_sentences`` samples that many
    training lines, shuffled (large corpora)."""
    import sentencepiece

    options = dict(
        input=",".join(map(str, files)), model_prefix=str(model_prefix),
        vocab_size=vocab_size, model_type="unigram", character_coverage=1.0,
        hard_vocab_limit=False, minloglevel=log_level,
    )
    if not keep_sentencepiece_specials:
        options.update(bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0)
    if threads:
        options.update(num_threads=threads)
    if max_sentences:
        options.update(input_sentence_size=max_sentences, shuffle_input_sentence=True)
    sentencepiece.SentencePieceTrainer.train(**options)


def load(model_file):
    """The SentencePiece processor of ``model_file``: load it once, encode many."""
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=str(model_file))


def encode_lines(processor, lines):
    """Each line (stripped of surrounding white space) as space-separated
    pieces; ``processor`` from :func:`load`."""
    return [" ".join(processor.encode(line.strip(), out_type=str)) for line in lines]


def encode_files(model_file, files, output_dir):
    """Each file (plain or .gz) encoded into ``output_dir`` under its name
    (without .gz), one line of pieces per line."""
    processor = load(model_file)
    os.makedirs(output_dir, exist_ok=True)
    for path in map(str, files):
        with open_text(path) as source:
            pieces = encode_lines(processor, source)
        name = Path(path).name.removesuffix(".gz")
        with open(Path(output_dir) / name, "w", encoding="utf-8") as out:
            out.writelines(line + "\n" for line in pieces)
