"""Where a fresh model starts: validation bits per target token of a fresh
``--natbias-order 1`` and ``--natbias-order 2`` model against the unigram
and the Witten-Bell bigram they are meant to start at (issue 39).

    python benchmarks/bigram_start.py DATA-BIN -s de -t en [--model-args "..."]

DATA-BIN: a translation data-bin (``fairseq-preprocess``). The priors'
cross-entropies are computed from the package's own counts
(``unigram.count_binarized`` with a ``bigram.PairCounter``); the test
``tests/test_bigram_residual.py`` checks the same against counts made
independently. Prints a markdown table.
"""

import argparse
import math
import shlex
from pathlib import Path

import numpy as np
import torch

from fairseq_natbias import pipeline



def build(data_bin, src, tgt, model_args, order):
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fairseq_natbias.pipeline import this_plugin_as_user_dir

    argv = this_plugin_as_user_dir([
        str(data_bin), "-s", src, "-t", tgt, "--arch", "transformer_natbias", "--cpu",
        "--seed", "1", "--save-dir", "/nonexistent/checkpoints", "--natbias-order", str(order),
        *shlex.split(model_args)])
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    cfg = convert_namespace_to_omegaconf(args)
    utils.set_torch_seed(1)
    task = tasks.setup_task(cfg.task)
    return task, task.build_model(cfg.model)


def bits_per_target(task, model, scores=None):
    """The model's bits per validation target, or (``scores``) those of a
    function (previous, target) -> log-probability in nats."""
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    pad = task.target_dictionary.pad()
    model.eval()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(dataset), 100):
            batch = dataset.collater([dataset[i] for i in range(start, min(start + 100, len(dataset)))])
            target = batch["target"]
            mask = target.ne(pad)
            if scores is None:
                lprobs = model.get_normalized_probs(model(**batch["net_input"]), log_probs=True)
                picked = lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
            else:
                picked = scores(batch["net_input"]["prev_output_tokens"], target)
            total -= picked[mask].double().sum().item()
            tokens += int(mask.sum())
    return total / tokens / math.log(2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_bin", type=Path)
    parser.add_argument("-s", "--source-lang", required=True)
    parser.add_argument("-t", "--target-lang", required=True)
    parser.add_argument("--model-args", default=" ".join(pipeline.MODEL),
                        help="model options (default: the study's model, pipeline.MODEL)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for order in (2, 1):
        task, model = build(args.data_bin, args.source_lang, args.target_lang, args.model_args, order)
        rows.append((f"fresh `--natbias-order {order}` model", bits_per_target(task, model)))
    log_p = model.target_log_unigram.double()
    rows.append(("add-one unigram of the training targets",
                 bits_per_target(task, model, lambda prev, target: log_p[target])))
    table = _bigram_table(task, order2_model=build(args.data_bin, args.source_lang,
                                                   args.target_lang, args.model_args, 2)[1])
    rows.insert(1, ("Witten-Bell bigram of the training targets",
                    bits_per_target(task, model, lambda prev, target: (
                        torch.log_softmax(log_p + table[prev], -1)
                        .gather(-1, target.unsqueeze(-1)).squeeze(-1)))))
    print(f"\n{args.data_bin} ({args.source_lang}->{args.target_lang}), validation set\n")
    print("| | validation bits per target token |\n|---|---|")
    for name, bits in rows:
        print(f"| {name} | {bits:.4f} |")


def _bigram_table(task, order2_model):
    """D as a dense float64 matrix (fine for the vocabularies this runs on)."""
    residual = order2_model.decoder.bigram_residual
    vocab = residual.vocab_size
    dense = np.zeros((vocab, vocab))
    rows = np.repeat(np.arange(vocab), np.diff(residual.indptr.numpy()))
    dense[rows, residual.indices.numpy()] = residual.values.double().numpy()
    return torch.from_numpy(dense)


if __name__ == "__main__":
    main()
