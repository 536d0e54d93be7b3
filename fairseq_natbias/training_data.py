"""What a fairseq task trains a model to predict, counted: the one place the
models and the criteria count their unigram (with :mod:`natbias.counts`); which
tokens count, per task, is docs/options.md#what-is-counted.

Multilingual sampling: with ratios r the task draws S r_i / sum(r) of its S
sentences from pair i (S: ``--virtual-data-size``, else fairseq's own rule),
uniformly within it, so each of pair i's n_i sentences counts S r_i / sum(r)
/ n_i times: on the corpus's own scale, add-one smoothing weighs as much as
for one pair.
"""

import itertools
import logging
import os
from dataclasses import dataclass

import numpy as np
import torch

from natbias import head
from natbias.counts import binarised_index, check_counts, count_binarised, count_chunks
from natbias.counts.corpus import count_indexed
from natbias.errors import NaturalBiasError
from natbias.prior import DEFAULT_SMOOTHING, log_unigram

logger = logging.getLogger(__name__)

NO_SPLIT_FIX = (
    "--natbias-init unigram counts the tokens the model learns to predict: "
    "binarise them with fairseq-preprocess --trainpref, or choose --natbias-init "
    "file --natbias-counts PATH, zero, or none"
)


MULTILINGUAL_FIX = "or give the bias from a counts file (--natbias-init file --natbias-counts PATH)"


class MissingTrainingSplit(NaturalBiasError):
    """No binarised training split where the task would read it."""


@dataclass
class Split:
    """One binarised file prefix, e.g. ``data/train.de-en.en``, and its format."""

    prefix: str
    impl: str


def find_splits(data: str, split: str, names) -> list[Split]:
    """Every binarised file fairseq trains on for ``split``: ``names(shard,
    split_k)`` yields candidate prefixes in one shard for ``split_k`` =
    ``train``, ``train1``, ... (fairseq concatenates them)."""
    from fairseq.data import indexed_dataset

    found = []
    for shard in [p for p in data.split(":") if p]:
        for k in itertools.count():
            split_k = split + (str(k) if k > 0 else "")
            existing = [
                prefix
                for prefix in names(shard, split_k)
                if indexed_dataset.infer_dataset_impl(prefix) is not None
            ]
            if not existing:
                break
            found.append(Split(existing[0], indexed_dataset.infer_dataset_impl(existing[0])))
    return found


def count_split(split: Split, vocab_size: int, pairs=None) -> np.ndarray:
    """Token counts of one split: the mmap format read directly, the others
    (lazy, cached, raw) through fairseq's reader."""
    if split.impl == "mmap":
        return count_binarised(split.prefix, vocab_size, pairs)
    from fairseq.data import data_utils

    dataset = data_utils.load_indexed_dataset(split.prefix, None, split.impl)
    if dataset is None:
        raise NaturalBiasError(f"could not read {split.prefix} as --dataset-impl {split.impl}")
    tokens = np.concatenate([np.asarray(dataset[i]) for i in range(len(dataset))] or [[]])
    return count_chunks([tokens], vocab_size, split.prefix, pairs)


def _sum_counts(splits, vocab_size, pairs=None) -> np.ndarray:
    """The splits' counts. The mmap ones (fairseq-preprocess's default) are
    counted together, split across the ranks of a distributed run, and kept
    in the first data directory for the next start (natbias.counts.corpus)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    mmap = [s for s in splits if s.impl == "mmap"] if pairs is None else []
    if mmap:
        folder = os.path.dirname(mmap[0].prefix) or "."
        prefixes = [s.prefix for s in mmap]
        counts += count_indexed(prefixes, vocab_size, cache_dir=folder, quiet_cache=True)
    for split in splits:
        if split not in mmap:
            counts += count_split(split, vocab_size, pairs)
    counts = check_counts(counts, f"the training split(s) {[s.prefix for s in splits]}")
    logger.info(
        "target unigram: %d tokens counted in %s",
        int(counts.sum()),
        ", ".join(s.prefix for s in splits),
    )
    return counts


def count_translation_targets(data, split, source_lang, target_lang, vocab_size, pairs=None):
    def names(shard, split_k):
        for pair in (f"{source_lang}-{target_lang}", f"{target_lang}-{source_lang}"):
            yield os.path.join(shard, f"{split_k}.{pair}.{target_lang}")

    splits = find_splits(data, split, names)
    if not splits:
        first = os.path.join(
            data.split(":")[0], f"{split}.{source_lang}-{target_lang}.{target_lang}"
        )
        raise MissingTrainingSplit(
            f"no binarised target training split (looked for {first}.bin and "
            f"the {target_lang}-{source_lang} order in {data!r}). {NO_SPLIT_FIX}"
        )
    return _sum_counts(splits, vocab_size, pairs)


def count_lm_targets(data, split, dictionary, cfg, pairs=None):
    splits = find_splits(data, split, lambda shard, split_k: [os.path.join(shard, split_k)])
    if not splits:
        raise MissingTrainingSplit(
            f"no binarised training split for the language model (looked "
            f"for {os.path.join(data.split(':')[0], split)}.bin, as "
            f"`fairseq-preprocess --only-source` writes it, in {data!r}). "
            f"{NO_SPLIT_FIX}"
        )
    output_size = getattr(cfg, "output_dictionary_size", None)
    if output_size is not None and not 0 <= output_size < len(dictionary):
        output_size = None
    if pairs is not None and output_size is not None:
        raise NaturalBiasError(
            f"--natbias-order 2 with --output-dictionary-size {output_size}: the "
            "bigram table pairs tokens of one dictionary; drop one of the two"
        )
    counts = _sum_counts(splits, len(dictionary), pairs)
    if getattr(cfg, "add_bos_token", False):
        counts[dictionary.bos()] += sum(_blocks(s.prefix, cfg) for s in splits)
    if output_size is not None:
        counts[dictionary.unk()] += counts[output_size:].sum()
        counts = counts[:output_size].copy()
    return counts


def _blocks(prefix, cfg) -> int:
    """How many blocks fairseq's language_modeling task cuts ``prefix`` into."""
    from fairseq.data import data_utils, indexed_dataset

    from fairseq_natbias._compat import slice_indices

    if indexed_dataset.infer_dataset_impl(prefix) == "mmap":
        sizes = binarised_index(prefix)[1]
    else:
        sizes = data_utils.load_indexed_dataset(prefix, None).sizes
    sizes = np.array(sizes, dtype=np.int64)  # a copy: the Cython slicer wants its own int64
    mode = str(getattr(cfg, "sample_break_mode", None) or "none")  # fairseq passes an enum
    if mode == "eos":
        return len(sizes)
    return len(slice_indices(sizes, mode, cfg.tokens_per_sample, 1))


def is_multilingual(task) -> bool:
    return hasattr(task, "data_manager") and hasattr(task, "lang_pairs")


def target_language_tokens(task) -> dict:
    """Each target language's token id as the decoder is given it (None without ``--decoder-langtok``)."""
    spec = task.args.langtoks["main"][1]
    langs = dict.fromkeys(pair.split("-")[1] for pair in task.lang_pairs)
    return {lang: task.data_manager.get_decoder_langtok(lang, spec) for lang in langs}


def _sampled_sentences(task, keys, sizes):
    """How many sentences the task draws from each pair in one pass over its
    sampled data, by its own rules and ratios (None: concatenated, each sentence once)."""
    from fairseq.data.multilingual.sampled_multi_dataset import default_virtual_size_func

    args = task.args
    if args.sampling_weights_from_file:
        from fairseq.data.multilingual.multilingual_data_manager import load_sampling_weights

        weights = load_sampling_weights(args.sampling_weights_from_file)
        ratios = [weights[key] for key in keys]
    elif args.sampling_weights:
        ratios = [args.sampling_weights[key] for key in keys]
    else:
        sample = task.data_manager.sampling_method.sampling_method_selector()
        if sample is None:
            return None
        ratios = sample(sizes)
    ratios = np.asarray(ratios, dtype=np.float64)
    total = task.args.virtual_data_size or default_virtual_size_func(
        [range(n) for n in sizes],
        ratios,  # fairseq's rule reads len() of each pair
    )
    return total * ratios / ratios.sum()


def count_multilingual_targets(task, split: str) -> tuple[np.ndarray, dict]:
    """The pooled counts (float, weighted as the task samples) and each target
    language's (without its language token, which row 0 predicts)."""
    args = task.args
    if getattr(args, "extra_data", None) or getattr(args, "extra_lang_pairs", None):
        raise NaturalBiasError(
            "the natural bias counts the main data of --lang-pairs; --extra-data and "
            f"--extra-lang-pairs are not counted: drop them, {MULTILINGUAL_FIX}"
        )
    dictionary = task.target_dictionary
    tokens = target_language_tokens(task)
    prepended = not args.lang_tok_replacing_bos_eos
    pairs = [pair.split("-") for pair in task.lang_pairs]
    counts = [
        count_translation_targets(args.data, split, src, tgt, len(dictionary)) for src, tgt in pairs
    ]
    sizes = [int(c[dictionary.eos()]) for c in counts]  # every target ends with one EOS
    sampled = _sampled_sentences(task, [f"main:{src}-{tgt}" for src, tgt in pairs], sizes)
    pooled = np.zeros(len(dictionary))
    by_language = {lang: np.zeros(len(dictionary)) for lang in tokens}
    for k, ((_, tgt), c, n) in enumerate(zip(pairs, counts, sizes)):
        weight = 1.0 if sampled is None else sampled[k] / n  # each sentence's expected draws
        by_language[tgt] += weight * c
        pooled += weight * c
        if tokens[tgt] is not None and prepended:  # the language token: every target's first
            pooled[tokens[tgt]] += weight * n
    return pooled, by_language


def language_tokens_as_fed(task, counts: np.ndarray) -> np.ndarray:
    """A counts file's target language tokens that it counts 0 (one made from
    ``dict.LANG.txt``), counted as the task feeds them (``--decoder-langtok``:
    one first in each sentence, which ends in one EOS): the EOS count, split
    among them. At 0 a first target cost 14.1 bits at update 0, now 5.9 (Multi30k)."""
    args = getattr(task, "args", None)
    if not is_multilingual(task) or getattr(args, "lang_tok_replacing_bos_eos", False):
        return counts  # no language token among the targets
    unseen = [t for t in target_language_tokens(task).values() if t is not None and counts[t] == 0]
    if unseen:
        counts = counts.astype(np.float64)
        counts[unseen] = counts[task.target_dictionary.eos()] / len(unseen)
    return counts


def task_config(task):
    """A task's options: ``task.cfg`` (dataclass tasks) or ``task.args`` (legacy ones)."""
    return getattr(task, "cfg", None) or getattr(task, "args", None)


def count_training_targets(task, split: str = "train", pairs=None) -> np.ndarray:
    """Counts of the tokens ``task`` trains a model to predict, one per entry
    of its target dictionary; ``pairs`` (a :class:`natbias.bigram.PairCounter`)
    counts the bigrams in the same pass."""
    cfg = task_config(task)
    if is_multilingual(task):
        if pairs is not None:
            raise NaturalBiasError(
                "--natbias-order 2 counts one target stream; the multilingual task samples "
                "several: use --natbias-order 1"
            )
        return count_multilingual_targets(task, split)[0]
    if getattr(cfg, "source_lang", None) and getattr(cfg, "target_lang", None):
        return count_translation_targets(
            cfg.data, split, cfg.source_lang, cfg.target_lang, len(task.target_dictionary), pairs
        )
    if hasattr(cfg, "tokens_per_sample") and hasattr(task, "output_dictionary"):
        return count_lm_targets(cfg.data, split, task.source_dictionary, cfg, pairs)
    raise NaturalBiasError(
        f"cannot tell which tokens task {type(task).__name__} trains a model "
        "to predict: the natural bias counts the target side of --task "
        "translation or the text of --task language_modeling; give the bias "
        "from a counts file instead (--natbias-init file --natbias-counts PATH)"
    )


def symbols(dictionary) -> list[str]:
    """A fairseq dictionary's symbols in id order (what counts files are keyed by)."""
    return [dictionary[i] for i in range(len(dictionary))]


def criterion_prior(task, model, split: str, criterion: str) -> torch.Tensor:
    """log omega for a criterion: the model's own prior when it has the
    natural bias (so the two use one unigram, smoothed by --natbias-smoothing),
    else the training targets counted with add-one smoothing."""
    log_prior = getattr(model, "target_log_unigram", None)
    if log_prior is not None and torch.any(log_prior != 0):  # per-language: the pooled row
        return head.pooled_row(log_prior.detach().float().cpu())
    try:
        counts = count_training_targets(task, split)
    except MissingTrainingSplit as error:
        where = str(error).split(". ")[0]
        raise NaturalBiasError(
            f"criterion {criterion} counts the training targets of a model "
            f"without the natural bias, but finds {where[0].lower()}{where[1:]}."
            " Binarise the training data with fairseq-preprocess --trainpref, "
            "or train with --criterion label_smoothed_cross_entropy"
        ) from None
    return log_unigram(counts, DEFAULT_SMOOTHING)
