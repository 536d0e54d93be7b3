"""Per-update cost of unigram_regularized_cross_entropy and of the logging hook.

Ratios of the time of one fairseq training update (fairseq's own Trainer:
forward, backward, Adam step, logging reduction) on CPU:

  unigram_regularized_cross_entropy / label_smoothed_cross_entropy  (term on)
  hook on / hook off (--no-natbias-logging), kl statistics every update
  hook on / hook off, on the updates without kl statistics (by default the
      statistics come every --log-interval = 100 updates; the amortised
      overhead printed is the second plus 1/100 of the first)

Every configuration trains the same model (one state dict, reloaded at the
start of each round) on the same batches. Updates are interleaved: batch by
batch, every configuration makes one update, in an order that rotates; a
ratio is taken between the two updates of the same batch in the same round,
and the figure reported is the median over all of them (with quartiles).

    .venv/bin/python benchmarks/bench_criterion.py            # defaults below
    .venv/bin/python benchmarks/bench_criterion.py --rounds 3 --updates 4

The data are synthetic Zipfian parallel text with a realistic target
vocabulary (--vocab, default 8000 as for a SentencePiece model); the model is
the paper's IWSLT preset (6+6 layers, d=256). The regulariser's work is
O(tokens x vocab), as is the rest of the output layer, so the ratio depends
little on --vocab and shrinks as the model grows.
"""

import argparse
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

# Use this checkout's fairseq_natbias (also the one --user-dir names below).
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
BIN = Path(sys.executable).parent

CONFIGS = {
    # name: extra fairseq-train options
    "label_smoothed_cross_entropy": ["--criterion", "label_smoothed_cross_entropy"],
    "unigram_regularized_cross_entropy": [
        "--criterion", "unigram_regularized_cross_entropy",
        "--unigram-reg-weight", "0.1", "--unigram-reg-updates", "1000000000",
    ],
    "hook_off": ["--criterion", "label_smoothed_cross_entropy", "--no-natbias-logging"],
    "hook_every_update": ["--criterion", "label_smoothed_cross_entropy",
                          "--natbias-stats-interval", "1"],
}
RATIOS = [
    ("unigram_regularized_cross_entropy", "label_smoothed_cross_entropy",
     "unigram_regularized_cross_entropy / label_smoothed_cross_entropy"),
    ("hook_every_update", "hook_off", "hook on (kl stats every update) / hook off"),
    ("label_smoothed_cross_entropy", "hook_off", "hook on (updates without kl stats) / hook off"),
]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--updates", type=int, default=6, help="timed updates per run (default 6)")
    parser.add_argument("--vocab", type=int, default=8000, help="target (and source) vocabulary")
    parser.add_argument("--sentences", type=int, default=2000, help="synthetic training pairs")
    parser.add_argument("--max-tokens", type=int, default=2048, help="tokens per batch")
    parser.add_argument("--arch", default="transformer_natbias_iwslt_de_en")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--workdir", help="where the synthetic data go (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


# --- data ------------------------------------------------------------------------


def synthetic_corpus(root: Path, vocab: int, sentences: int, seed: int) -> Path:
    """Zipfian toy parallel text, binarised with fairseq-preprocess."""
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) for i in range(vocab)]
    text = root / "text"
    text.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", sentences), ("valid", 50)):
        for side, prefix in (("src", "s"), ("tgt", "t")):
            words = [f"{prefix}{i}" for i in range(vocab)]
            lines = [" ".join(rng.choices(words, weights, k=rng.randint(10, 40))) for _ in range(n)]
            if split == "train":  # every word once, so that the dictionary has them all
                lines += [" ".join(words[i:i + 40]) for i in range(0, vocab, 40)]
            (text / f"{split}.{side}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    binary = root / "bin"
    subprocess.run(
        [str(BIN / "fairseq-preprocess"), "--source-lang", "src", "--target-lang", "tgt",
         "--trainpref", text / "train", "--validpref", text / "valid",
         "--destdir", binary, "--workers", "1"],
        check=True, capture_output=True,
    )
    return binary


# --- one configuration: task, model, criterion, trainer ---------------------------


def build(data: Path, save_dir: Path, options, args):
    from fairseq.trainer import Trainer

    from fairseq_natbias.pipeline import build_from_training_args

    command = [
        str(data), "--user-dir", str(REPO / "fairseq_natbias"), "--arch", args.arch,
        "--cpu", "--seed", str(args.seed), "--optimizer", "adam", "--adam-betas", "(0.9, 0.997)",
        "--lr", "5e-4", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4000",
        "--label-smoothing", "0.1", "--max-tokens", str(args.max_tokens),
        "--save-dir", str(save_dir), "--num-workers", "0", *options,
    ]
    cfg, task, model = build_from_training_args(command)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    trainer.begin_epoch(1)  # where the criterion counts its unigram
    return trainer


def fixed_batches(trainer, count):
    iterator = trainer.get_train_iterator(epoch=1, load_dataset=True)
    batches = []
    for sample in iterator.next_epoch_itr(shuffle=False):
        batches.append(sample)
        if len(batches) == count:
            return batches
    raise SystemExit(f"only {len(batches)} batches; raise --sentences")


def timed_update(trainer, sample) -> float:
    start = time.perf_counter()
    trainer.train_step([sample])
    return time.perf_counter() - start


def measure(trainers, batches, rounds):
    """Seconds per update, {config: [one per (round, batch)]}. Each round
    reloads the initial weights and warms every configuration up with one
    update; then, batch by batch, every configuration updates once, in an
    order that rotates, so slow drifts in machine load hit all alike."""
    initial = {k: v.clone() for k, v in trainers["hook_off"].get_model().state_dict().items()}
    names = list(trainers)
    seconds = {name: [] for name in names}
    for r in range(rounds):
        for trainer in trainers.values():
            trainer.get_model().load_state_dict(initial)
            trainer.train_step([batches[-1]])
        for i, sample in enumerate(batches):
            shift = (r * len(batches) + i) % len(names)
            for name in names[shift:] + names[:shift]:
                seconds[name].append(timed_update(trainers[name], sample))
        print(f"round {r + 1}/{rounds}: " + ", ".join(
            f"{n} {statistics.median(s[-len(batches):]) * 1000:.0f} ms" for n, s in seconds.items()),
            flush=True)
    return seconds


def fastest_per_batch(times, batches):
    """Per batch, the fastest of its updates over the rounds: the least
    disturbed by other work on the machine."""
    return [min(times[i::batches]) for i in range(batches)]


def term_in_isolation(trainer, batch, repeats=40):
    """Seconds the regulariser adds to the loss head alone (log-softmax,
    label-smoothed loss, backward to the logits), interleaved with and
    without it: a short, repeatable measurement, far less exposed to the
    machine's load than whole updates."""
    from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

    criterion = trainer.get_criterion()
    target = batch["target"].view(-1)
    logits = torch.randn(target.numel(), len(trainer.task.target_dictionary), requires_grad=True)

    def head(with_term):
        start = time.perf_counter()
        lprobs = torch.log_softmax(logits, -1)
        loss, _ = label_smoothed_nll_loss(lprobs, target, criterion.eps, criterion.padding_idx)
        if with_term:
            loss = loss + criterion.unigram_term(lprobs, target, None)[0].sum()
        loss.backward()
        logits.grad = None
        return time.perf_counter() - start

    times = {True: [], False: []}
    for r in range(repeats):
        for with_term in (r % 2 == 0, r % 2 == 1):
            times[with_term].append(head(with_term))
    return statistics.median(times[True]) - statistics.median(times[False]), statistics.median(times[False])


def report(seconds, batches, argv, isolated=None):
    print()
    print("per-update time ratios: median over (round, batch) pairs [quartiles];")
    print("then the median over batches of the ratio of their fastest updates")
    medians = {}
    for mine, base, label in RATIOS:
        ratios = sorted(a / b for a, b in zip(seconds[mine], seconds[base]))
        q1, med, q3 = statistics.quantiles(ratios, n=4)
        fastest = statistics.median(
            a / b for a, b in zip(fastest_per_batch(seconds[mine], batches),
                                  fastest_per_batch(seconds[base], batches)))
        medians[mine, base] = med
        print(f"  {label:58s} {med:.3f}  [{q1:.3f}, {q3:.3f}]   fastest: {fastest:.3f}")
    every = medians["hook_every_update", "hook_off"] - 1
    unarmed = medians["label_smoothed_cross_entropy", "hook_off"] - 1
    print(f"  hook at the default interval, amortised: {100 * (unarmed + every / 100):+.2f}% per update")
    base = statistics.median(seconds["label_smoothed_cross_entropy"])
    print(f"  (label_smoothed_cross_entropy: {base * 1000:.0f} ms per update)")
    if isolated is not None:
        extra, head = isolated
        print(f"  the term alone: +{extra * 1000:.1f} ms on a {head * 1000:.0f} ms loss head "
              f"(forward + backward to the logits) = {100 * extra / base:+.2f}% of an update")
    print()
    print("reproduce with:")
    print(f"  cd {REPO} && .venv/bin/python benchmarks/bench_criterion.py {shlex.join(argv)}".rstrip())


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    import logging
    import warnings

    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.workdir or tmp)
        data = synthetic_corpus(root, args.vocab, args.sentences, args.seed)
        trainers = {}
        for name, options in CONFIGS.items():
            torch.manual_seed(args.seed)
            trainers[name] = build(data, root / f"save_{name}", options, args)
        state = trainers["hook_off"].get_model().state_dict()
        for trainer in trainers.values():
            trainer.get_model().load_state_dict(state)  # one model for all
        batches = fixed_batches(trainers["hook_off"], args.updates)
        tokens = sum(int(b["ntokens"]) for b in batches) / len(batches)
        print(f"{args.arch}, |V| = {len(trainers['hook_off'].task.target_dictionary)}, "
              f"{tokens:.0f} target tokens per update, {args.threads} thread(s), "
              f"{args.updates} updates x {args.rounds} rounds per configuration")
        seconds = measure(trainers, batches, args.rounds)
        isolated = term_in_isolation(trainers["unigram_regularized_cross_entropy"], batches[0])
        report(seconds, len(batches), argv, isolated)


if __name__ == "__main__":
    main()
