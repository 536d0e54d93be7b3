r"""natbias-step0: how far a freshly built model is from the unigram (Fig. 1 at
update 0), before spending any compute on training.

Takes the same arguments as fairseq-train, builds the task and the model the
way fairseq-train does (same seed, same initialisation), and reports on the
validation split, in bits per target token:

    nll          the model's validation NLL before any update
    unigram_ce   cross-entropy of the validation targets under the smoothed
                 training unigram (what a model that predicts the unigram gets)
    kl_unigram   mean KL(p_theta(.|y_<t) || unigram)

    natbias-step0 data-bin --user-dir fairseq_natbias --arch transformer_natbias \
        --share-all-embeddings --natbias-init unigram
"""

import json
import math
import os
import sys

import torch

LN2 = math.log(2.0)


def build_from_training_args(argv):
    """Task and model exactly as ``fairseq-train ARGV`` would build them."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = _this_plugin_as_user_dir(argv)
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


def _this_plugin_as_user_dir(argv):
    """``--user-dir .../fairseq_natbias`` names this package, already imported
    here: point it at this very copy, which fairseq accepts."""
    from fairseq_natbias import plugin_dir

    argv = list(argv)
    for i, arg in enumerate(argv[:-1]):
        if arg == "--user-dir" and os.path.basename(os.path.normpath(argv[i + 1])) == "fairseq_natbias":
            argv[i + 1] = plugin_dir()
    return argv


def validation_divergence(task, model, split="valid", max_tokens=4000):
    """Token-weighted NLL, unigram cross-entropy and KL(model || unigram), bits."""
    task.load_dataset(split, combine=False, epoch=1)
    dataset = task.dataset(split)
    iterator = task.get_batch_iterator(
        dataset, max_tokens=max_tokens, ignore_invalid_inputs=True,
    ).next_epoch_itr(shuffle=False)
    log_unigram = model.target_log_unigram if hasattr(model, "target_log_unigram") else None
    pad = task.target_dictionary.pad()
    totals = {"nll": 0.0, "unigram_ce": 0.0, "kl_unigram": 0.0, "tokens": 0}
    model.eval()
    with torch.no_grad():
        for sample in iterator:
            _accumulate(model, sample, pad, log_unigram, totals)
    tokens = totals.pop("tokens")
    if tokens == 0:
        raise SystemExit(f"natbias-step0: the {split} split has no target tokens")
    result = {key: value / tokens / LN2 for key, value in totals.items()}
    result["tokens"] = tokens
    if log_unigram is None:
        del result["unigram_ce"], result["kl_unigram"]
    return result


def _accumulate(model, sample, pad, log_unigram, totals):
    net_output = model(**sample["net_input"])
    log_p = model.get_normalized_probs(net_output, log_probs=True).float()
    target = sample["target"]
    mask = target.ne(pad)
    totals["nll"] -= log_p.gather(-1, target.unsqueeze(-1)).squeeze(-1)[mask].sum().item()
    totals["tokens"] += int(mask.sum())
    if log_unigram is not None:
        totals["unigram_ce"] -= log_unigram[target[mask]].sum().item()
        kl = (log_p.exp() * (log_p - log_unigram)).sum(-1)
        totals["kl_unigram"] += kl[mask].sum().item()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    cfg, task, model = build_from_training_args(argv)
    result = validation_divergence(task, model, split=cfg.dataset.valid_subset.split(",")[0])
    print(json.dumps({key: round(value, 4) for key, value in result.items()}))


if __name__ == "__main__":
    main()
