"""``--task translation_multi_simple_epoch``: the tokens its model learns to
predict, counted as the task feeds them (with :mod:`fairseq_natbias.training_data`).

Each pair's target side ``train.SRC-TGT.TGT``, EOS included; ``--decoder-langtok``
prepends the target language's token to every target (the first token the
model predicts), ``--lang-tok-replacing-bos-eos`` feeds it as the decoder's
first input instead (never a target). Pairs are weighted as the task samples
them: with sampling ratios r (``--sampling-method`` uniform or temperature,
``--sampling-weights``, ``--sampling-weights-from-file``) an epoch draws
r_i / sum(r) of its sentences from pair i, uniformly within it, so pair i's
counts c_i weigh ``r_i / n_i`` (n_i its sentences); ``concat`` reads every
sentence once (weight 1).

One prior per target language (``--natbias-prior per-language``): row 0 is
the pooled prior, used where the decoder has not yet been told the language
(the position that predicts the language token); row k the unigram of the
k-th target language's sentences, used from the language token on.
"""

import numpy as np

from fairseq_natbias import training_data
from natbias.errors import NaturalBiasError

FIX = "or give the bias from a counts file (--natbias-init file --natbias-counts PATH)"


def is_multilingual(task) -> bool:
    return hasattr(task, "data_manager") and hasattr(task, "lang_pairs")


def target_language_tokens(task) -> dict:
    """Each target language's token id as the decoder is given it (None without ``--decoder-langtok``)."""
    spec = task.args.langtoks["main"][1]
    langs = dict.fromkeys(pair.split("-")[1] for pair in task.lang_pairs)
    return {lang: task.data_manager.get_decoder_langtok(lang, spec) for lang in langs}


def language_symbols(task) -> list:
    """The language tokens the task adds to the dictionaries it reads (a counts
    file made from ``dict.LANG.txt`` lacks them)."""
    if not is_multilingual(task):
        return []
    from fairseq.data.multilingual.multilingual_utils import get_lang_tok

    return [get_lang_tok(lang, task.args.lang_tok_style) for lang in task.langs]


def _sampling_ratios(task, keys, sizes):
    """The task's own sampling ratios, by its own rules (None: concatenated)."""
    args = task.args
    if args.sampling_weights_from_file:
        from fairseq.data.multilingual.multilingual_utils import load_sampling_weights

        weights = load_sampling_weights(args.sampling_weights_from_file)
        return [weights[key] for key in keys]
    if args.sampling_weights:
        return [args.sampling_weights[key] for key in keys]
    sample = task.data_manager.sampling_method.sampling_method_selector()
    return None if sample is None else sample(sizes)


def count_multilingual_targets(task, split: str) -> tuple[np.ndarray, dict]:
    """The pooled counts (float, weighted as the task samples) and each target
    language's (without its language token, which row 0 predicts)."""
    args = task.args
    if getattr(args, "extra_data", None) or getattr(args, "extra_lang_pairs", None):
        raise NaturalBiasError(
            "the natural bias counts the main data of --lang-pairs; --extra-data and "
            f"--extra-lang-pairs are not counted: drop them, {FIX}"
        )
    dictionary = task.target_dictionary
    tokens = target_language_tokens(task)
    prepended = not args.lang_tok_replacing_bos_eos
    pairs = [pair.split("-") for pair in task.lang_pairs]
    counts = [
        training_data.count_translation_targets(args.data, split, src, tgt, len(dictionary))
        for src, tgt in pairs
    ]
    sizes = [int(c[dictionary.eos()]) for c in counts]  # every target ends with one EOS
    ratios = _sampling_ratios(task, [f"main:{src}-{tgt}" for src, tgt in pairs], sizes)
    pooled = np.zeros(len(dictionary))
    by_language = {lang: np.zeros(len(dictionary)) for lang in tokens}
    for (_, tgt), c, n, k in zip(pairs, counts, sizes, range(len(pairs))):
        weight = 1.0 if ratios is None else ratios[k] / sum(ratios) / n
        by_language[tgt] += weight * c
        pooled += weight * c
        if tokens[tgt] is not None and prepended:
            pooled[tokens[tgt]] += weight * n
    return pooled, by_language


def language_rows(task, per_language: bool) -> list:
    """The token of each target language that selects its prior row (row k
    for the k-th); refused where the decoder is never told the language.
    One target language has a row too: the words' own unigram, without the
    language token that row 0 predicts."""
    if not is_multilingual(task):
        if per_language:
            raise NaturalBiasError(
                f"--natbias-prior per-language needs a task with several target languages "
                f"(--task translation_multi_simple_epoch), not {type(task).__name__}: drop it"
            )
        return []
    tokens = target_language_tokens(task)
    if not per_language or list(tokens.values()) == [None]:  # one language, never told: pooled
        return []
    if None in tokens.values():
        raise NaturalBiasError(
            f"--natbias-prior per-language: the decoder is not told which of {sorted(tokens)} "
            "to write: add --decoder-langtok, or use --natbias-prior pooled"
        )
    return list(tokens.values())
