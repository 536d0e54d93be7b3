"""Teacher-forced scores of fairseq checkpoints (translation and language
models): the reading and batching examples/paper/frequency.py (Fig. 4) and
natbias-loss-by-frequency share, each reference token's log-probability, the
average predicted distribution (Kobayashi et al., 2023, sec. 3.1) and whole
sentences' log-probabilities under a language model (natbias-frequency-bias).
Natural logarithms; the statistics themselves are natbias.tools.by_frequency's.
``score_pair`` and ``sentence_scorer`` are what natbias.tools.frequency asks of
an engine's scorer (the ``natbias.scorers`` entry point ``fairseq``).
"""

import glob
import os
from collections.abc import Sequence
from typing import Optional

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from fairseq_natbias import checkpoint_loading, training_data
from natbias.errors import NaturalBiasError


def read_with_fairseq(path: str, arg_overrides: dict) -> dict:
    """fairseq's own reading (``checkpoint_utils.load_checkpoint_to_cpu``: the
    state upgraded to this fairseq's format, ``arg_overrides`` applied), what
    ``load_model_ensemble_and_task(..., state=)`` takes; checkpoint_loading's errors."""
    from fairseq import checkpoint_utils

    checkpoint_loading.require_file(path)
    checkpoint_loading.allow_fairseq_checkpoints()
    try:
        return checkpoint_utils.load_checkpoint_to_cpu(path, arg_overrides)
    except Exception:
        # Unpickling a file that is no checkpoint fails in any way (a text
        # file: IndexError inside torch's weights-only unpickler). If torch
        # cannot read the file either, read_checkpoint raises the refusal;
        # if it can, the failure was fairseq's and goes on as it is.
        checkpoint_loading.read_checkpoint(path)
        raise


def load_checkpoint(path: str, data: str, split: Optional[str], use_cuda: bool):
    """Model, task and config of ``path`` with its data directory replaced by
    ``data``; ``split`` loaded (None: no split, the task's dictionaries only)."""
    from fairseq import checkpoint_utils, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    state = read_with_fairseq(path, {"data": data})
    cfg = state.get("cfg") or convert_namespace_to_omegaconf(state["args"])
    task = tasks.setup_task(cfg.task)
    # the embedding tables must have one row per entry of the data's dictionaries
    for key, dictionary, side in (
        ("encoder.embed_tokens.weight", task.source_dictionary, "source"),
        ("decoder.embed_tokens.weight", task.target_dictionary, "target"),
    ):
        if key in state["model"] and dictionary is not None:
            rows = state["model"][key].shape[0]
            if rows != len(dictionary):
                raise NaturalBiasError(
                    f"mismatched dictionaries: {path} was trained with a {side} "
                    f"dictionary of {rows} entries, the {side} dictionary in {data} "
                    f"has {len(dictionary)}. Use the data directory the model was "
                    "trained on (its dict.*.txt files)."
                )
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides={"data": data}, task=task, state=state
    )
    model = models[0].eval()
    if use_cuda:
        model.cuda()
    if split is not None:
        _load_split(task, split)
    return model, task, cfg


def _load_split(task, split):
    data = training_data.task_config(task).data
    # Checked before fairseq opens it: numpy cannot memory-map an empty .bin,
    # and fairseq's half-built dataset then fails again in its __del__.
    first_dir = str(data).split(":")[0]
    bins = glob.glob(os.path.join(first_dir, f"{split}.bin")) + glob.glob(
        os.path.join(first_dir, f"{split}.*.bin")
    )
    if any(os.path.getsize(b) == 0 for b in bins):
        raise NaturalBiasError(f"the {split} split of {data} is empty: nothing to score")
    try:
        task.load_dataset(split)
    except ValueError as error:
        raise NaturalBiasError(f"cannot read the {split} split of {data}: {error}") from None


def batches(model, task, split, max_tokens=4096):
    """Every sentence of a loaded split once, in fixed order: no batch dropped
    for its size (fairseq issue #5036), none longer than the model takes."""
    from fairseq import utils

    dataset = task.dataset(split)
    if len(dataset) == 0:
        raise NaturalBiasError(
            f"the {split} split of {training_data.task_config(task).data} is empty: nothing to score"
        )
    return task.get_batch_iterator(
        dataset=dataset,
        max_tokens=max_tokens,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=True,
        required_batch_size_multiple=1,
        seed=1,
        num_workers=0,
    ).next_epoch_itr(shuffle=False)


def check_token_ids(sample, task):
    for tokens, dictionary, side in (
        (sample["net_input"]["src_tokens"], task.source_dictionary, "source"),
        (sample["target"], task.target_dictionary, "target"),
    ):
        if tokens.numel() and int(tokens.max()) >= len(dictionary):
            raise NaturalBiasError(
                f"mismatched dictionaries: the binarised {side} side holds token id "
                f"{int(tokens.max())}, the {side} dictionary has {len(dictionary)} "
                "entries; the split was binarised with another dictionary"
            )


def reference_log_probs(model, task, split, max_tokens=4096, use_cuda=False):
    """``({sentence id: (target ids, their log-probabilities)}, summed
    predicted distribution, positions)`` over the reference tokens of ``split``."""
    from fairseq import utils

    by_id, average, positions = {}, None, 0
    with torch.no_grad():
        for sample in batches(model, task, split, max_tokens):
            check_token_ids(sample, task)
            if use_cuda:
                sample = utils.move_to_cuda(sample)
            lprobs = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
            target = sample["target"]
            mask = target.ne(model.decoder.padding_idx)
            picked = lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1).double()
            summed = lprobs[mask].double().exp().sum(0).cpu()
            average = summed if average is None else average + summed
            positions += int(mask.sum())
            for row, sentence in enumerate(sample["id"].tolist()):
                kept = mask[row]
                by_id[sentence] = (
                    target[row][kept].cpu().numpy().astype(np.int64),
                    picked[row][kept].cpu().numpy(),
                )
    return by_id, average.numpy(), positions


def training_counts(task, cfg) -> np.ndarray:
    """Counts of the training targets of the checkpoint's task (its train subset)."""
    split = getattr(cfg.dataset, "train_subset", None) or "train"
    return training_data.count_training_targets(task, split)


def sentence_log_probs(
    model, dictionary, sentences: Sequence[Sequence[int]], use_cuda=False, batch_size=32
) -> list[float]:
    """Each sentence's log-probability under a language model: its tokens and
    EOS predicted after an EOS (fairseq's start of a sentence), summed."""
    scores = []
    pad, eos = dictionary.pad(), dictionary.eos()
    with torch.no_grad():
        for start in range(0, len(sentences), batch_size):
            chunk = [torch.tensor([*s, eos]) for s in sentences[start : start + batch_size]]
            target = pad_sequence(chunk, batch_first=True, padding_value=pad)
            source = torch.cat([torch.full((len(chunk), 1), eos), target[:, :-1]], dim=1)
            source[source == pad] = eos  # after the sentence's end: never read for its tokens
            lengths = torch.tensor([len(ids) for ids in chunk])
            if use_cuda:
                source, target, lengths = source.cuda(), target.cuda(), lengths.cuda()
            output = model(source, src_lengths=lengths)
            lprobs = model.get_normalized_probs(output, log_probs=True).double()
            picked = lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
            scores += picked.masked_fill(target.eq(pad), 0).sum(1).tolist()
    return scores


def score_pair(args, progress):
    """natbias-loss-by-frequency's two checkpoints (``args.baseline``,
    ``args.model``) on the ``args.gen_subset`` split of ``args.data``: the
    reference ids, each model's log-probabilities of them, the training counts,
    each model's average prediction."""
    paths, cuda = (args.baseline, args.model), torch.cuda.is_available() and not args.cpu
    # both read (and their dictionaries checked) before either is scored
    loaded = [load_checkpoint(p, args.data, args.gen_subset, cuda) for p in paths]
    scored = []
    for path, (model, task, _) in zip(paths, loaded):
        progress(f"scoring the {args.gen_subset} split of {args.data} with {path}")
        scored.append(reference_log_probs(model, task, args.gen_subset, args.max_tokens, cuda))
    counts = training_counts(*loaded[0][1:])
    (base, base_avg, n), (other, other_avg, _) = scored
    if sorted(base) != sorted(other) or any(
        not np.array_equal(base[i][0], other[i][0]) for i in base
    ):
        raise NaturalBiasError(
            "the two checkpoints read the split differently (another --tokens-per-sample?): "
            "their reference tokens do not match"
        )
    order = sorted(base)
    return (
        np.concatenate([base[i][0] for i in order]),
        np.concatenate([base[i][1] for i in order]),
        np.concatenate([other[i][1] for i in order]),
        counts,
        (base_avg / n, other_avg / n),
    )


def sentence_scorer(args):
    """natbias-frequency-bias's language model ``args.model``: (texts -> their
    ids, ids of sentences -> their log-probabilities, the training counts)."""
    cuda = torch.cuda.is_available() and not args.cpu
    model, task, cfg = load_checkpoint(args.model, args.data, None, cuda)
    if getattr(task, "tgt_dict", None) is not None:
        raise NaturalBiasError(f"{args.model} is a translation model: give a language model")
    dictionary = task.target_dictionary
    if args.spm:
        from natbias.tools import sentencepiece_text

        processor = sentencepiece_text.load(args.spm)
        split = lambda text: sentencepiece_text.encode_lines(processor, [text])[0].split()  # noqa: E731
    else:
        split = str.split
    encode = lambda texts: [[dictionary.index(piece) for piece in split(t)] for t in texts]  # noqa: E731
    score = lambda ids: sentence_log_probs(model, dictionary, ids, cuda, batch_size=64)  # noqa: E731
    return encode, score, training_counts(task, cfg)
