"""What a trained model does at the reference's positions, teacher-forced
(issue 36): validation NLL, how often its most likely token is the
reference's (top-1 accuracy), its entropy, and how much it expects the
sentence to end.

Why these: the NLL is what the study selects and compares on, but beam
search follows the mode. ``unigram_label_smoothed_cross_entropy`` trains
every position towards q = (1 - eps) onehot(y) + eps omega (the target
unigram; fairseq's uniform smoothing has eps/|V| in place of eps omega), so
it can lower the NLL by where it puts the smoothed mass without the mode
improving. Per position t with reference y_t and model p = p(. | y_<t, x):

    NLL      -log2 p(y_t)                         (bits, mean over tokens)
    top-1    [argmax_v p(v) = y_t]
    entropy  -sum_v p(v) log2 p(v)
    p(EOS)   p(EOS) at the positions whose y_t is not EOS, and at those
             whose y_t is EOS (omega(EOS) is one over the mean target
             length plus one, so the criterion asks eps omega(EOS) at every
             non-final position, uniform smoothing eps/|V|)

over every sentence of one split (fairseq's own validation drops the last
batch when it is not a multiple of ``--required-batch-size-multiple``,
fairseq issue #5036, so its NLL can differ a little from the one here).
Each checkpoint is read as natbias-frequency reads it. Checkpoints are
named ``ARM:SEED=PATH``; the arms other than the first are then also
printed as differences to the first, paired by seed (mean ± standard
error)::

    .venv/bin/python benchmarks/teacher_forced.py WORK/de-en_n3000/data-bin \\
        stock:1=RUN/stock/seed1/checkpoint_best.pt default:1=RUN/.../seed1/checkpoint_best.pt
"""

import argparse
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fairseq_natbias.analysis.stats import mean_stderr  # noqa: E402

LN2 = math.log(2.0)
# (key of :func:`means`, column label, decimals printed for it and for its paired difference)
MEASURES = (("nll", "NLL (bits)", 4), ("top1", "top-1 accuracy", 4), ("entropy", "entropy (bits)", 3),
            ("eos_non_final", "p(EOS), non-final", 5), ("eos_final", "p(EOS), final", 4))


def batch_sums(lprobs, target, eos, pad):
    """Sums over one batch's positions: ``lprobs`` (batch, length,
    vocabulary) natural log-probabilities, ``target`` (batch, length) ids;
    padding counts nowhere. Keys: tokens, final (positions whose reference
    is EOS), nll (nats), top1, entropy (nats), eos_non_final, eos_final."""
    import torch

    lprobs = lprobs.float()
    real = target.ne(pad)
    final = target.eq(eos) & real
    non_final = real & ~final
    reference = lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    entropy = torch.special.entr(lprobs.exp()).sum(-1)  # 0 where p = 0, not 0 * -inf
    p_eos = lprobs[..., eos].exp()
    return {
        "tokens": int(real.sum()), "final": int(final.sum()),
        "nll": -reference[real].sum().item(),
        "top1": int((lprobs.argmax(-1).eq(target) & real).sum()),
        "entropy": entropy[real].sum().item(),
        "eos_non_final": p_eos[non_final].sum().item(),
        "eos_final": p_eos[final].sum().item(),
    }


def means(sums):
    """Per-token means of :func:`batch_sums`'s totals, NLL and entropy in bits."""
    tokens, final = sums["tokens"], sums["final"]
    non_final = tokens - final
    if not non_final or not final:
        raise SystemExit("teacher_forced: the split has no target positions to average")
    return {"nll": sums["nll"] / tokens / LN2, "top1": sums["top1"] / tokens,
            "entropy": sums["entropy"] / tokens / LN2,
            "eos_non_final": sums["eos_non_final"] / non_final,
            "eos_final": sums["eos_final"] / final, "tokens": tokens}


def teacher_forced(model, task, split, max_tokens=4096):
    """:func:`means` of ``model`` over every sentence of ``split`` of
    ``task``'s data (loaded already), in eval mode."""
    import torch

    from fairseq_natbias.analysis.frequency import reference_batches

    dictionary = task.target_dictionary
    batches = reference_batches(model, task, task.dataset(split), max_tokens)
    totals = {}
    model.eval()
    with torch.no_grad():
        for sample in batches:
            output = model(**sample["net_input"])
            lprobs = model.get_normalized_probs(output, log_probs=True)
            for key, value in batch_sums(lprobs, sample["target"], dictionary.eos(),
                                         dictionary.pad()).items():
                totals[key] = totals.get(key, 0) + value
    return means(totals)


def parse_name(item):
    """``ARM:SEED=PATH`` (or ``NAME=PATH``) as (arm, seed or None, path)."""
    name, _, path = item.rpartition("=")
    if not name or not Path(path).is_file():
        raise SystemExit(f"teacher_forced: give ARM:SEED=CHECKPOINT with an existing file, not {item!r}")
    arm, _, seed = name.partition(":")
    return arm, (seed or None), path


def tables(results):
    """Markdown: one row per checkpoint, then each later arm minus the first,
    paired by seed. ``results``: [(arm, seed, means), ...] in order."""
    head = "| model | " + " | ".join(label for _, label, _ in MEASURES) + " | tokens |"
    rows = [head, "|---|" + "---|" * (len(MEASURES) + 1)]
    for arm, seed, values in results:
        name = arm if seed is None else f"{arm}, seed {seed}"
        rows.append(f"| {name} | " + " | ".join(f"{values[key]:.{digits}f}" for key, _, digits in MEASURES)
                    + f" | {values['tokens']:,} |")
    arms = list(dict.fromkeys(arm for arm, _, _ in results))
    by_arm = {arm: {seed: values for a, seed, values in results if a == arm} for arm in arms}
    reference = arms[0]
    diff_rows = []
    for arm in arms[1:]:
        seeds = [s for s in by_arm[arm] if s is not None and s in by_arm[reference]]
        if not seeds:
            continue
        cells = [mean_stderr([by_arm[arm][s][key] - by_arm[reference][s][key] for s in seeds]).signed(digits)
                 for key, _, digits in MEASURES]
        diff_rows.append(f"| {arm} − {reference} (seeds {', '.join(seeds)}) | " + " | ".join(cells) + " |")
    if diff_rows:
        rows += ["", f"Paired by seed, mean ± standard error, − {reference}:", "",
                 "| difference | " + " | ".join(label for _, label, _ in MEASURES) + " |",
                 "|---|" + "---|" * len(MEASURES), *diff_rows]
    return "\n".join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_bin", type=Path)
    parser.add_argument("checkpoints", nargs="+", metavar="ARM:SEED=CHECKPOINT")
    parser.add_argument("--split", default="valid")
    args = parser.parse_args(argv)
    import torch

    from fairseq_natbias.analysis.frequency import load_checkpoint

    torch.set_num_threads(1)  # beside trainings: one core
    named = [parse_name(item) for item in args.checkpoints]  # all checked before any loading
    results = []
    for arm, seed, path in named:
        # natbias-frequency's loading: the package's checkpoint reading, the
        # dictionaries checked against data_bin's, the split loaded.
        model, task, _ = load_checkpoint(path, str(args.data_bin), args.split, use_cuda=False)
        results.append((arm, seed, teacher_forced(model, task, args.split)))
        print(f"teacher_forced: {arm} {seed or ''} done", file=sys.stderr, flush=True)
    print(tables(results))


if __name__ == "__main__":
    main()
