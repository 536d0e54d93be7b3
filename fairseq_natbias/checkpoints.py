"""A model that will load a checkpoint is built with the checkpoint's
natural-bias settings, so that its parameters mean what they meant when saved.

:func:`checkpoint_to_load` finds, by fairseq's own restore rules, whether and
what a run will load; :func:`check_saved_settings` refuses a checkpoint
this version cannot build; :func:`reconcile_with_checkpoint`
takes the checkpoint's structural settings for those left at their
defaults, refusing an explicit option that disagrees. The file itself is read by
:mod:`fairseq_natbias.checkpoint_loading`; what loads, and what is refused:
docs/checkpoints.md.
"""

import logging
import os

from fairseq_natbias.checkpoint_loading import saved_model_args
from fairseq_natbias.options import (
    COUNTED_MARKER,
    DEFAULTED_RECORD,
    FORMAT_KEY,
    LANGUAGE_TOKENS,
    STRUCTURAL,
    options_text,
)
from natbias.errors import NaturalBiasError
from natbias.head import check_format_version

logger = logging.getLogger(__name__)

# The last version that reads a checkpoint of 0.x (never published; it records no format).
LAST_READER = "0.8.0"


def check_saved_settings(saved, where: str) -> None:
    """Refuse, in one line, a saved config this version cannot build."""
    if getattr(saved, FORMAT_KEY, None) is None:
        raise NaturalBiasError(
            f"{where} was written by fairseq-natbias 0.x, before 1.0's checkpoint format: "
            f"read it with fairseq-natbias {LAST_READER}, the last version that does"
        )
    check_format_version(getattr(saved, FORMAT_KEY), where)


def checkpoint_to_load(args):
    """``(kind, path)`` when the parameters built now will be overwritten from
    a checkpoint, else None. ``kind``: ``config`` (the config itself came from
    a checkpoint: generation, eval-lm), ``resume`` or ``finetune``, by the
    rules of fairseq's ``checkpoint_utils.load_checkpoint``."""
    if getattr(args, COUNTED_MARKER, None) is not None:
        return "config", None
    save_dir = getattr(args, "save_dir", "checkpoints")
    restore_file = getattr(args, "restore_file", "checkpoint_last.pt")
    suffix = getattr(args, "checkpoint_suffix", "") or ""
    resets = ("reset_optimizer", "reset_lr_scheduler", "reset_meters", "reset_dataloader")
    kind = "finetune" if any(getattr(args, r, False) for r in resets) else "resume"
    if restore_file == "checkpoint_last.pt":
        last = os.path.join(save_dir, f"checkpoint_last{suffix}.pt")
        if os.path.exists(last):
            return kind, last
        continue_once = getattr(args, "continue_once", None)
        if continue_once is not None:  # fairseq loads it, or fails saying it is missing
            return (kind, continue_once) if os.path.exists(continue_once) else None
        finetune = getattr(args, "finetune_from_model", None)
        if finetune and os.path.exists(finetune):
            return "finetune", finetune
        return None
    restore_file = restore_file.replace(".pt", suffix + ".pt")
    return (kind, restore_file) if os.path.exists(restore_file) else None


def reconcile_with_checkpoint(args, kind: str, path: str) -> None:
    """Build the model with the natural-bias settings of the checkpoint it
    will load: an option left at its default follows the checkpoint; one
    given explicitly and different is refused, naming both and the fix (a
    user's value is never overridden). Fine-tuning: the log says what becomes
    of the bias."""
    saved = saved_model_args(path)
    if saved is None or getattr(saved, "natbias_init", None) is None:
        arch = getattr(saved, "arch", "unknown")
        fix = (
            f"resume it with --arch {arch}"
            if kind == "resume"
            else "fine-tune it with its own --arch"
        )
        raise NaturalBiasError(
            f"{path} was not trained with the natural bias (--arch {arch}); "
            f"{fix}, or train a natbias model from scratch in a new --save-dir"
        )
    check_saved_settings(saved, path)
    explicit = [name for name in STRUCTURAL if name not in (getattr(args, DEFAULTED_RECORD) or ())]
    differing = [name for name in STRUCTURAL if _differs(args, saved, name)]
    refused = [name for name in differing if name in explicit]
    if refused:  # a user's own value is never overridden
        how = "resume" if kind == "resume" else "fine-tune (its output layer loads as trained)"
        raise NaturalBiasError(
            f"{path} was trained with {options_text(saved)}; the command line asks for "
            f"{options_text(args, refused)}. Give a new --save-dir to train that from scratch "
            f"(without the checkpoint), or drop those options to {how}"
        )
    for name in differing:  # defaults only: a run that loads a checkpoint defaults to its settings
        setattr(args, name, getattr(saved, name))
    if kind == "finetune":
        logger.warning(
            "natbias: fine-tuning from %s: its output layer is loaded as trained "
            "(%s), not re-initialised or recounted",
            path,
            options_text(saved),
        )
    elif differing:
        logger.info("natbias: resuming %s with its own %s", path, options_text(saved))
    setattr(args, COUNTED_MARKER, int(getattr(saved, COUNTED_MARKER, None) or 0))
    setattr(args, LANGUAGE_TOKENS, list(getattr(saved, LANGUAGE_TOKENS, None) or []))


def _differs(args, saved, name) -> bool:
    if name == "natbias_gain_speed" and getattr(saved, "natbias_weight_init", None) != "gain":
        return False  # no gain in the checkpoint: its speed means nothing
    value = getattr(saved, name, None)
    return value is not None and value != getattr(args, name)
