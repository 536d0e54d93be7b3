"""The task and model fairseq-train would build, built here in this process
(natbias-step0, the tests and the research scripts use it), and what
natbias-step0 measures on a fresh model: validation NLL, the unigram's
cross-entropy and KL(p || unigram), in bits per target token."""

import os
import sys

from fairseq_natbias.language_prior import ROWS_KEY
from natbias.errors import NaturalBiasError
from natbias.statistics import Statistics


def build_from_training_args(argv):
    """Task and model exactly as ``fairseq-train ARGV`` would build them."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = this_plugin_as_user_dir(argv)
    saved_argv, sys.argv = sys.argv, [sys.argv[0], *argv]  # fairseq reads --user-dir there too
    try:
        parser = options.get_training_parser()
        args = options.parse_args_and_arch(parser, input_args=argv)
    finally:
        sys.argv = saved_argv
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    return cfg, task, model


def this_plugin_as_user_dir(argv):
    """``argv`` with its ``--user-dir`` passed through :func:`this_copy`."""
    argv = list(argv)
    for i, arg in enumerate(argv[:-1]):
        if arg == "--user-dir":
            argv[i + 1] = this_copy(argv[i + 1])
    return argv


def this_copy(user_dir):
    """A ``--user-dir .../fairseq_natbias`` pointed at this very copy of the
    package, already imported (fairseq refuses another copy as "not globally
    unique"); any other plugin unchanged."""
    from fairseq_natbias import plugin_dir

    if os.path.basename(os.path.normpath(user_dir)) == "fairseq_natbias":
        return plugin_dir()
    return user_dir


def validation_divergence(task, model, split="valid", max_tokens=4000):
    """Token-weighted NLL, unigram cross-entropy and KL(model || unigram), in bits
    (what natbias-step0 prints for a freshly built model)."""
    import torch

    task.load_dataset(split, combine=False, epoch=1)
    iterator = task.get_batch_iterator(
        task.dataset(split), max_tokens=max_tokens, ignore_invalid_inputs=True
    ).next_epoch_itr(shuffle=False)
    prior, pad = getattr(model, "target_log_unigram", None), task.target_dictionary.pad()
    totals = Statistics(dtype=torch.float64)  # batch sums added in float64
    model.eval()
    with torch.no_grad():
        for sample in iterator:
            out = model(**sample["net_input"])
            log_p = model.get_normalized_probs(out, log_probs=True).float()
            target = sample["target"]  # ROWS_KEY: each position's row of a per-language prior
            totals.add(log_p, target.ne(pad), prior, out[1].get(ROWS_KEY), targets=target)
    if not totals.sums.get("tokens"):
        raise NaturalBiasError(
            f"the {split} split has no target tokens: give another --valid-subset"
        )
    bits = totals.bits()
    result = {key: bits[key] for key in ("nll", "unigram_ce", "kl_unigram") if key in bits}
    return {**result, "tokens": int(totals.sums["tokens"])}
