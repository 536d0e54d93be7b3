"""How much does a model expect the sentence to end? Teacher-forced mean
p(EOS) at the target positions that are not the last, and at the last
(issue 36: the criterion's prior and the outputs' length).

Label smoothing trains every position towards q = (1 - eps) onehot(y) +
eps u. At a position whose reference token is not EOS, q(EOS) is eps/|V|
under fairseq's uniform u, and eps omega(EOS) under the target unigram
(``unigram_label_smoothed_cross_entropy``; omega(EOS) is one over the mean
target length plus one). This measures what a trained model puts there:
the mean of p(EOS | y_<t, x) over the reference's non-final positions, and
over its final positions (where the reference token is EOS), on one split
of a data-bin, each checkpoint read as natbias-frequency reads it.

    .venv/bin/python benchmarks/eos_probability.py WORK/de-en_n3000/data-bin \\
        stock=RUN/stock/seed1/checkpoint_best.pt default=RUN/.../checkpoint_best.pt
"""

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def eos_sums(lprobs, target, eos, pad):
    """(sum of p(EOS) over non-final positions, their count, the same over
    final positions, their count) of one batch: ``lprobs`` (batch, length,
    vocabulary) log-probabilities, ``target`` (batch, length) token ids;
    padding counts nowhere."""
    p_eos = lprobs[..., eos].float().exp()
    final = target.eq(eos)
    non_final = target.ne(pad) & ~final
    return (p_eos[non_final].sum().item(), int(non_final.sum()),
            p_eos[final].sum().item(), int(final.sum()))


def mean_eos_probability(model, task, split, max_tokens=4096):
    """``(non-final mean, final mean, non-final positions, final positions)``
    of ``model`` on ``split`` of ``task``'s data (loaded already),
    teacher-forced, in eval mode."""
    import torch

    dictionary = task.target_dictionary
    batches = task.get_batch_iterator(task.dataset(split), max_tokens=max_tokens,
                                      ignore_invalid_inputs=True).next_epoch_itr(shuffle=False)
    totals = [0.0, 0, 0.0, 0]
    model.eval()
    with torch.no_grad():
        for sample in batches:
            output = model(**sample["net_input"])
            lprobs = model.get_normalized_probs(output, log_probs=True)
            sums = eos_sums(lprobs, sample["target"], dictionary.eos(), dictionary.pad())
            totals = [a + b for a, b in zip(totals, sums)]
    non_final_sum, non_final, final_sum, final = totals
    if not non_final or not final:
        raise SystemExit(f"eos_probability: split {split!r} has no target positions to average")
    return non_final_sum / non_final, final_sum / final, non_final, final


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_bin", type=Path)
    parser.add_argument("checkpoints", nargs="+", metavar="NAME=CHECKPOINT")
    parser.add_argument("--split", default="valid")
    args = parser.parse_args(argv)
    import torch

    from fairseq_natbias.analysis.frequency import load_checkpoint

    torch.set_num_threads(1)  # beside trainings: one core
    rows = ["| model | mean p(EOS), non-final positions | mean p(EOS), final positions | positions |",
            "|---|---|---|---|"]
    for item in args.checkpoints:
        name, _, path = item.rpartition("=")
        if not name or not Path(path).is_file():
            raise SystemExit(f"eos_probability: give NAME=CHECKPOINT with an existing file, not {item!r}")
        # natbias-frequency's loading: the package's checkpoint reading, the
        # dictionaries checked against data_bin's, the split loaded.
        model, task, _ = load_checkpoint(path, str(args.data_bin), args.split, use_cuda=False)
        non_final, final, n_non_final, n_final = mean_eos_probability(model, task, args.split)
        rows.append(f"| {name} | {non_final:.5f} | {final:.4f} | {n_non_final:,} + {n_final:,} |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
