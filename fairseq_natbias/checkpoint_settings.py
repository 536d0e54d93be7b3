"""A model that will load a checkpoint is built with the checkpoint's
natural-bias settings, so its parameters mean what they meant when saved.

:func:`checkpoint_to_load` finds, by fairseq's own restore rules, whether and
what a fairseq-train (or generate, eval-lm) run will load;
:func:`reconcile_with_checkpoint` then takes the checkpoint's structural
settings, refusing (on resume) an explicit option that disagrees. The
checkpoint file itself is read by :mod:`fairseq_natbias.checkpoint_loading`.
"""

import logging
import os

from fairseq_natbias import checkpoint_loading
from fairseq_natbias.natural_bias_options import (
    COUNTED_MARKER, DEFAULTED_RECORD, GAIN_SETTINGS, STRUCTURAL, NaturalBiasError,
    options_text, with_legacy_settings,
)

logger = logging.getLogger(__name__)


def checkpoint_to_load(args):
    """``(kind, path)`` when the parameters built now will be overwritten from
    a checkpoint, else None. ``kind``: ``config`` (the config itself came from
    a checkpoint: generation, eval-lm), ``resume`` or ``finetune``, by
    fairseq's own restore rules (``checkpoint_utils.load_checkpoint``):
    checkpoint_last in --save-dir wins; on a first launch --continue-once,
    then --finetune-from-model; a non-default --restore-file has the
    --checkpoint-suffix put before its ``.pt``. A checkpoint loaded with a
    --reset-* flag is fine-tuned, otherwise resumed."""
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


def saved_model_args(path: str):
    """The model config a fairseq checkpoint was trained with (None if the
    file holds none), read by :mod:`fairseq_natbias.checkpoint_loading`; a
    file that is no checkpoint is a :class:`NaturalBiasError` naming the fix."""
    try:
        return checkpoint_loading.saved_model_args(path)
    except checkpoint_loading.CheckpointError as error:
        raise NaturalBiasError(str(error)) from None


def reconcile_with_checkpoint(args, kind: str, path: str) -> None:
    """Build the model with the natural-bias settings of the checkpoint it
    will load, so its parameters mean what they meant when saved.

    Resuming: an option left at its default follows the checkpoint (so runs
    started with an earlier default resume unchanged); one given explicitly
    and different is refused, naming both and the fix. Fine-tuning: the
    checkpoint's settings are taken and the log says what becomes of the bias.
    """
    saved = saved_model_args(path)
    if saved is not None:
        saved = with_legacy_settings(saved)
    if saved is None or getattr(saved, "natbias_init", None) is None:
        arch = getattr(saved, "arch", "unknown")
        raise NaturalBiasError(
            f"{path} was not trained with the natural bias (--arch {arch}); "
            f"{'resume it with --arch ' + arch if kind == 'resume' else 'fine-tune it with its own --arch'}, "
            "or train a natbias model from scratch in a new --save-dir."
        )
    explicit = [name for name in STRUCTURAL
                if name not in (getattr(args, DEFAULTED_RECORD, None) or ())]
    differing = [name for name in STRUCTURAL if _differs(args, saved, name)]
    if kind == "resume":
        refused = [name for name in differing if name in explicit]
        if refused:
            raise NaturalBiasError(
                f"{path} was trained with {options_text(saved)}; the command line "
                f"asks for {options_text(args, refused)}. Resuming would continue "
                f"the checkpoint's model, not the one asked for. Give a new "
                f"--save-dir to train {options_text(args, refused)} from scratch, or "
                f"drop those options (or give the checkpoint's) to resume."
            )
    for name in differing:
        setattr(args, name, getattr(saved, name))
    if kind == "finetune":
        ignored = [name for name in differing if name in explicit]
        logger.warning(
            "natbias: fine-tuning from %s: its output bias%s and W are loaded as "
            "trained (%s), not re-initialised or recounted%s",
            path, ", gain" if args.natbias_weight_init == "gain" else "",
            options_text(saved),
            "; " + ", ".join("--" + n.replace("_", "-") for n in ignored)
            + " on the command line ignored" if ignored else "",
        )
    elif differing:
        logger.info("natbias: resuming %s with its own %s", path, options_text(saved))
    setattr(args, COUNTED_MARKER, int(getattr(saved, COUNTED_MARKER, None) or 0))


def _differs(args, saved, name) -> bool:
    if name in GAIN_SETTINGS and getattr(saved, "natbias_weight_init", None) != "gain":
        return False  # no gain in the checkpoint: its speed and form mean nothing
    value = getattr(saved, name, None)
    return value is not None and value != getattr(args, name)
