"""Teacher-forced scores of transformers causal language models, for
natbias-loss-by-frequency and natbias-frequency-bias: each token's
log-probability in lines of text, the average predicted distribution
(Kobayashi et al., 2023, sec. 3.1), whole sentences' log-probabilities, and
the training counts in the model's tokens. Natural logarithms.

A line is read as the model was trained on it (examples/huggingface): its
tokenizer's encoding (special tokens included, e.g. the closing ``</s>``),
every token of it predicted after a start token, the model's
``bos_token_id`` (its ``eos_token_id`` where it has none); a start token the
tokenizer itself puts first is that context, not a token to predict.

``score_pair`` and ``sentence_scorer`` are what natbias.tools.frequency asks of
an engine's scorer (the ``natbias.scorers`` entry point ``transformers``).
"""

import os
from collections.abc import Sequence
from typing import Optional

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from natbias.counts import count_ids, open_text, read_counts_file
from natbias.errors import NaturalBiasError
from natbias.tools.generate_output import read_text_lines


def load_causal_lm(path: str, use_cuda: bool = False):
    """The model (natural bias or stock) and tokenizer saved in folder ``path``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    import natbias.hf  # noqa: F401  (registers the natural-bias classes with the Auto classes)

    if not os.path.isfile(os.path.join(path, "config.json")):
        raise NaturalBiasError(
            f"{path} is not a transformers model folder (no config.json); give a "
            "folder written by save_pretrained, or a fairseq checkpoint with --data"
        )
    transformers_logging.disable_progress_bar()  # the tools print one line per error, or results
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    if use_cuda:
        model.cuda()
    return model, tokenizer


def vocabulary_size(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


def start_token(model) -> int:
    config = model.config
    start = config.bos_token_id if config.bos_token_id is not None else config.eos_token_id
    if start is None:
        raise NaturalBiasError("the model's config has neither bos_token_id nor eos_token_id")
    return int(start)


def encode(tokenizer, model, lines: Sequence[str]) -> list[list[int]]:
    """Each line's encoding, less the start token where the tokenizer puts one
    first (it is the context, not a token to predict)."""
    start = start_token(model)
    encoded = [list(ids) for ids in tokenizer(list(lines))["input_ids"]]
    return [ids[1:] if ids and ids[0] == start else ids for ids in encoded]


def _log_probs(model, sequences: Sequence[Sequence[int]], batch_size: int, normalise=True):
    """Per batch: (targets [B, T], mask [B, T], log-probabilities [B, T, V]),
    with ``normalise=False`` the logits as the model gives them."""
    start = start_token(model)
    device = next(model.parameters()).device
    for first in range(0, len(sequences), batch_size):
        chunk = sequences[first : first + batch_size]
        ids = [torch.tensor(list(s), dtype=torch.long) for s in chunk]
        target = pad_sequence(ids, batch_first=True)
        mask = torch.arange(target.shape[1]) < torch.tensor([len(s) for s in ids])[:, None]
        inputs = torch.cat([torch.full((len(chunk), 1), start), target[:, :-1]], dim=1)
        attention = torch.cat([torch.ones((len(chunk), 1), dtype=torch.long), mask[:, :-1]], 1)
        logits = model(input_ids=inputs.to(device), attention_mask=attention.to(device)).logits
        yield target, mask, logits.double().log_softmax(-1).cpu() if normalise else logits.cpu()


def reference_log_probs(model, sequences: Sequence[Sequence[int]], batch_size: int = 16):
    """``(per sequence: (ids, their log-probabilities), summed predicted
    distribution, positions)``; empty sequences are left out."""
    sequences = [s for s in sequences if len(s)]
    if not sequences:
        raise NaturalBiasError("no text to score: every line is empty")
    scored, average, positions = [], None, 0
    with torch.no_grad():
        for target, mask, lprobs in _log_probs(model, sequences, batch_size):
            picked = lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
            summed = lprobs[mask].exp().sum(0)
            average = summed if average is None else average + summed
            positions += int(mask.sum())
            scored += [
                (target[r][mask[r]].numpy(), picked[r][mask[r]].numpy()) for r in range(len(target))
            ]
    return scored, average.numpy(), positions


def sentence_log_probs(
    model, sequences: Sequence[Sequence[int]], batch_size: int = 16
) -> list[float]:
    """Each sequence's log-probability, summed in float64 over its tokens'
    ``logit - logsumexp(logits)`` in the logits' precision: a copy of [B, T, V]
    in float64 took most of BLiMP's 134,000 sentences' time (about 5e-6 of a
    sentence's log-probability in float32; 2-layer GPT-2, vocabulary 8,000)."""
    scores = []
    with torch.no_grad():
        for target, mask, logits in _log_probs(model, sequences, batch_size, normalise=False):
            picked = logits.gather(-1, target.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)
            scores += picked.double().masked_fill(~mask, 0).sum(1).tolist()
    return scores


def training_counts(
    model, tokenizer, counts_file: Optional[str] = None, train_text: Optional[str] = None
) -> np.ndarray:
    """One count per output of the model: a counts file in the tokenizer's
    symbols (natbias-count's format), or the tokens of a training text file
    encoded as the lines are scored (every token of each line's encoding)."""
    size = vocabulary_size(model)
    if (counts_file is None) == (train_text is None):
        raise NaturalBiasError(
            "a transformers model's training counts: give --counts FILE or --train-text FILE"
        )
    if counts_file is not None:
        symbols = tokenizer.convert_ids_to_tokens(list(range(size)))
        return read_counts_file(counts_file, [s if s is not None else "" for s in symbols])
    with open_text(train_text) as lines:
        text = [line.rstrip("\n") for line in lines]
    return count_ids(encode(tokenizer, model, [line for line in text if line.strip()]), size)


def score_pair(args, progress):
    """natbias-loss-by-frequency's two model folders (``args.baseline``,
    ``args.model``) on the lines of ``args.text``: the reference ids, each
    model's log-probabilities of them, the training counts, each model's
    average prediction."""
    if not args.text:
        raise NaturalBiasError("transformers models need --text, the text to score")
    cuda = torch.cuda.is_available() and not args.cpu
    loaded = [load_causal_lm(path, cuda) for path in (args.baseline, args.model)]
    # Refused unless the two map text to the same ids.
    (model_a, tok_a), (model_b, tok_b) = loaded
    size_a, size_b = vocabulary_size(model_a), vocabulary_size(model_b)
    if size_a != size_b or tok_a.get_vocab() != tok_b.get_vocab():
        raise NaturalBiasError(
            f"models of different dictionaries: {args.baseline} ({size_a} "
            f"outputs, {len(tok_a)} tokens) and {args.model} ({size_b} outputs, "
            f"{len(tok_b)} tokens), their tokenizers map text to other ids; compare models "
            "trained with one tokenizer"
        )
    model, tokenizer = loaded[0]
    counts = training_counts(model, tokenizer, args.counts, args.train_text)
    lines = [line for line in read_text_lines(args.text, "text, one sentence a line") if line]
    sequences = encode(tokenizer, model, lines)
    scored = []
    for path, (model, _) in zip((args.baseline, args.model), loaded):
        progress(f"scoring {len(lines)} lines of {args.text} with {path}")
        scored.append(reference_log_probs(model, sequences))
    (base, base_avg, n), (other, other_avg, _) = scored
    return (
        np.concatenate([ids for ids, _ in base]),
        np.concatenate([lp for _, lp in base]),
        np.concatenate([lp for _, lp in other]),
        counts,
        (base_avg / n, other_avg / n),
    )


def sentence_scorer(args):
    """natbias-frequency-bias's causal LM folder ``args.model``: (texts -> their
    ids, ids of sentences -> their log-probabilities, the training counts)."""
    model, tokenizer = load_causal_lm(args.model, torch.cuda.is_available() and not args.cpu)
    counts = training_counts(model, tokenizer, args.counts, args.train_text)
    encode_all = lambda texts: encode(tokenizer, model, texts)  # noqa: E731
    return encode_all, lambda ids: sentence_log_probs(model, ids, batch_size=64), counts
