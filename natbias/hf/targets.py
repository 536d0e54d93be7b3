"""The target sequences of whatever a transformers Trainer is given as its
``train_dataset``, for counting the unigram of what the model predicts.

Taken: a 🤗 ``datasets.Dataset`` or ``IterableDataset`` (streaming too), read
a batch of its ``labels`` column (else ``input_ids``) at a time; a list, a
torch map-style or iterable ``Dataset``, or any iterable, of examples that
are dicts (``labels``, else ``input_ids``) or token-id sequences. Anything
else (text where token ids belong, a flat list of ids, one dict of columns)
is refused in one line naming what to pass.
"""

from collections.abc import Iterator, Mapping

from natbias.errors import NaturalBiasError

COLUMNS = ("labels", "input_ids")  # the targets, else the inputs a decoder predicts
BATCH = 1024
WHAT_TO_PASS = (
    "pass a tokenised dataset (labels or input_ids) or one list of token ids per sequence"
)


def target_sequences(targets) -> Iterator:
    """Each example's target ids, in order."""
    _check_container(targets)
    names = getattr(targets, "column_names", None)
    if names is not None and hasattr(targets, "iter"):
        yield from _columns(targets, names)
        return
    yield from map(_ids_of, _examples(targets))


def _check_container(targets) -> None:
    if isinstance(targets, (str, bytes)):
        raise NaturalBiasError(
            f"the targets are text ({targets[:40]!r}), not token ids: {WHAT_TO_PASS}"
        )
    if isinstance(targets, Mapping):
        splits = targets and all(hasattr(value, "column_names") for value in targets.values())
        fix = "one split, e.g. its ['train']" if splits else "its 'labels' or 'input_ids' list"
        raise NaturalBiasError(
            f"the targets are one dict (keys {sorted(targets)[:4]}), not a dataset: pass {fix}"
        )


def target_column(targets):
    """The target column (``labels``, else ``input_ids``) of a 🤗 dataset,
    which is counted from its Arrow arrays; None for anything else."""
    names = getattr(targets, "column_names", None)
    if names is None or not hasattr(targets, "iter") or not hasattr(targets, "with_format"):
        return None
    column = next((name for name in COLUMNS if name in names), None)
    if column is None:
        raise NaturalBiasError(
            f"the dataset has no 'labels' or 'input_ids' column (it has {list(names)}): "
            "tokenise it first"
        )
    return column


def _columns(dataset, names) -> Iterator:
    """A 🤗 dataset's target column, a batch at a time."""
    column = target_column(dataset)
    for batch in dataset.iter(batch_size=BATCH):
        yield from batch[column]


def _examples(targets) -> Iterator:
    """The examples of an iterable, or of a map-style dataset (a torch
    ``Dataset`` defines ``__getitem__`` and ``__len__``, not ``__iter__``)."""
    if not hasattr(targets, "__iter__") and hasattr(targets, "__getitem__"):
        if not hasattr(targets, "__len__"):
            raise NaturalBiasError(
                f"a {type(targets).__name__} has no len(), so its examples cannot be "
                "read in order: give it __len__, or an __iter__"
            )
        return (targets[index] for index in range(len(targets)))
    try:
        return iter(targets)
    except TypeError:
        raise NaturalBiasError(
            f"the targets are of type {type(targets).__name__}, not a dataset: {WHAT_TO_PASS}"
        ) from None


def _ids_of(example):
    if isinstance(example, Mapping):
        column = next((name for name in COLUMNS if name in example), None)
        if column is None:
            raise NaturalBiasError(
                f"an example has no 'labels' or 'input_ids' (its keys: {sorted(example)}): "
                "tokenise the dataset first"
            )
        example = example[column]
    if isinstance(example, (str, bytes)):
        raise NaturalBiasError(
            f"an example is text ({example[:40]!r}), not token ids: {WHAT_TO_PASS}"
        )
    if not hasattr(example, "__len__") or getattr(example, "ndim", 1) == 0:  # a number
        raise NaturalBiasError(
            f"an example is the {type(example).__name__} {str(example)[:40]}, not a sequence "
            f"of token ids (were the targets one flat list of ids?): {WHAT_TO_PASS}"
        )
    return example
