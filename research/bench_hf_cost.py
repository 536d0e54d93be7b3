"""Seconds per training update of the natural bias in transformers against
transformers' stock training, side by side, through the real Seq2SeqTrainer
(no validation, no saving), one CPU thread.

Two kinds of model:

* ``multi30k``: the model of examples/huggingface/translate.py (Marian,
  2+2 layers, d 128, a vocabulary of 8,000 trained here) on Multi30k De->En,
  80 sentence pairs an update, transformers' label_smoothing_factor 0.1;
* ``marian``, ``gpt2``, ``llama``: fresh models of d 512 and a vocabulary of
  32,000 (``--dim``, ``--vocab``, ``--layers``) on fixed-shape batches of
  Zipf-distributed token ids (cost does not depend on the text), the
  model's own cross-entropy.

The arms alternate, round after round, so that a change in the machine's
speed meets both alike; each round's ratio is arm / stock, and the median
over rounds is reported. An update's time is the mean over the updates
after the first ``--warm-up`` ones (allocations, first-call kernels).
``--profile`` prints, instead, torch's profiler's ops whose self time
differs most between the arms (where the extra cost goes).

    .venv/bin/python research/bench_hf_cost.py --family marian gpt2 llama --rounds 5 \\
        --out research/results/hf_cost_d512.md
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples" / "huggingface"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerCallback  # noqa: E402

import natbias.hf  # noqa: E402


class UpdateClock(TrainerCallback):
    def __init__(self, profiler=None):
        self.ends = []
        self.profiler = profiler

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())
        if self.profiler is not None:
            self.profiler.step()


def synthetic(args, seq2seq):
    """``updates`` batches of ids drawn from a Zipf law over the vocabulary."""
    rng = np.random.default_rng(1)
    weights = 1.0 / np.arange(1, args.vocab - 2)
    weights /= weights.sum()
    shape = (args.batch_size * (args.rounds * args.updates + 1), args.length)
    draw = lambda: rng.choice(np.arange(3, args.vocab), size=shape, p=weights).tolist()  # noqa: E731
    labels = draw()
    sources = draw() if seq2seq else labels
    return [{"input_ids": s, "labels": t} for s, t in zip(sources, labels)]


def build(family, args):
    d, layers, heads, vocab = args.dim, args.layers, 8, args.vocab
    ids = dict(pad_token_id=0, eos_token_id=1, bos_token_id=2)
    if family == "marian":
        config = transformers.MarianConfig(
            vocab_size=vocab,
            d_model=d,
            encoder_layers=layers,
            decoder_layers=layers,
            encoder_attention_heads=heads,
            decoder_attention_heads=heads,
            encoder_ffn_dim=4 * d,
            decoder_ffn_dim=4 * d,
            max_position_embeddings=args.length,
            decoder_start_token_id=0,
            dropout=0.0,
            **ids,
        )
        return transformers.MarianMTModel(config)
    if family == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=vocab, n_embd=d, n_layer=layers, n_head=heads, n_positions=args.length, **ids
        )
        return transformers.GPT2LMHeadModel(config)
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=int(8 * d / 3),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=args.length,
        **ids,
    )
    return transformers.LlamaForCausalLM(config)


def collate(features):
    return {k: torch.tensor([f[k] for f in features]) for k in ("input_ids", "labels")}


def multi30k_setup(args):
    import translate  # the example's data, tokenizer and model

    work = Path(args.work)
    pairs = translate.load_pairs(translate.parse_args(["--data", args.multi30k]), work)
    texts = list(pairs["train"]["source"]) + list(pairs["train"]["target"])
    tokenizer = translate.train_tokenizer(texts, 8000, work / "tokenizer")
    columns = ["source", "target"]
    train = pairs["train"].map(translate.tokenise(tokenizer), batched=True, remove_columns=columns)

    def collator(model):  # decoder inputs from the labels, as the example's
        return transformers.DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)

    def make(arm):
        bias = "none" if arm == "stock" else "natural"
        options = translate.parse_args(["--data", args.multi30k, "--bias", bias, "--seed", "1"])
        return translate.build_model(tokenizer, train, options)

    extra = dict(label_smoothing_factor=0.1, train_sampling_strategy="group_by_length")
    return make, train, collator, 80, extra


def synthetic_setup(family, args):
    seq2seq = family == "marian"
    data = synthetic(args, seq2seq)

    def make(arm):
        torch.manual_seed(1)
        model = build(family, args)
        if arm != "stock":
            targets = [row["labels"] for row in data]
            natbias.hf.add_natural_bias(model, targets)
        return model

    return make, data, lambda model: collate, args.batch_size, {}


def freeze_bias(model):
    bias = model.output_bias()  # final_logits_bias's is a view of the (1, V) parameter
    (bias if bias._base is None else bias._base).requires_grad_(False)


def run_arm(arm, setup, args, profile=False):
    make, data, collator, batch_size, extra = setup
    model = make(arm)
    if arm == "natbias-frozen-bias":  # what the bias's own gradient costs
        freeze_bias(model)
    profiler = None
    if profile:  # the updates after the warm-up ones
        schedule = torch.profiler.schedule(
            wait=args.warm_up - 1, warmup=1, active=args.updates - args.warm_up
        )
        activities = [torch.profiler.ProfilerActivity.CPU]
        profiler = torch.profiler.profile(activities=activities, schedule=schedule)
    clock = UpdateClock(profiler)
    training = Seq2SeqTrainingArguments(
        output_dir=str(Path(args.work) / "out"),
        max_steps=args.updates,
        seed=1,
        per_device_train_batch_size=batch_size,
        learning_rate=1e-3,
        max_grad_norm=0.0,
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        logging_steps=10**6,
        dataloader_num_workers=0,
        **extra,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=training,
        train_dataset=data,
        data_collator=collator(model),
        callbacks=[clock],
    )
    if profile:
        with profiler:
            trainer.train()
        return profiler.key_averages()
    trainer.train()
    ends = clock.ends[args.warm_up - 1 :]
    return (ends[-1] - ends[0]) / (len(ends) - 1)


def paired(setup, args, arms):
    """Updates of the arms side by side in one process, alternating update
    by update (Trainer.training_step, then the Trainer's optimizer), so that
    each update of an arm has a stock update next to it: the ratio of each
    pair, median over pairs."""
    make, data, collator, batch_size, extra = setup
    trainers = {}
    for arm in arms:
        model = make(arm)
        if arm == "natbias-frozen-bias":
            freeze_bias(model)
        training = Seq2SeqTrainingArguments(
            output_dir=str(Path(args.work) / "out"),
            learning_rate=1e-3,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            **extra,
        )
        trainer = Seq2SeqTrainer(model=model, args=training, data_collator=collator(model))
        trainer.create_optimizer()
        trainer.current_gradient_accumulation_steps = 1  # what train() sets
        model.train()
        trainers[arm] = trainer
    collate_batch = trainers["stock"].data_collator
    batches = [
        collate_batch(data[i * batch_size : (i + 1) * batch_size])
        for i in range(args.rounds * args.updates)
    ]
    times = {arm: [] for arm in arms}
    for step, batch in enumerate(batches):
        for arm in arms if step % 2 == 0 else arms[::-1]:
            trainer = trainers[arm]
            started = time.perf_counter()
            trainer.training_step(trainer.model, dict(batch))
            trainer.optimizer.step()
            trainer.optimizer.zero_grad()
            times[arm].append(time.perf_counter() - started)
    return {arm: values[args.warm_up :] for arm, values in times.items()}


def profile(family, setup, args):
    """The ops whose total self time differs most, natbias - stock: each arm
    profiled twice, in the order stock, natbias, natbias, stock."""
    totals = {}
    timed = 2 * (args.updates - args.warm_up)
    for arm in ("stock", "natbias", "natbias", "stock"):
        for event in run_arm(arm, setup, args, profile=True):
            totals.setdefault(event.key, {}).setdefault(arm, 0.0)
            totals[event.key][arm] += event.self_cpu_time_total / 1e3 / timed
    rows = sorted(totals.items(), key=lambda kv: kv[1].get("natbias", 0) - kv[1].get("stock", 0))
    print(f"## {family}: ms per update, self time (natbias - stock), largest differences")
    for key, arms in rows[::-1][:12] + rows[:4]:
        stock, ours = arms.get("stock", 0.0), arms.get("natbias", 0.0)
        print(f"{ours - stock:+9.2f}  {stock:9.2f}  {ours:9.2f}  {key}")
    whole = [sum(arms.get(a, 0.0) for arms in totals.values()) for a in ("stock", "natbias")]
    print(f"all ops: stock {whole[0]:.1f} ms, natbias {whole[1]:.1f} ms an update")


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--family", nargs="+", default=["multi30k"], choices=["multi30k", "marian", "gpt2", "llama"]
    )
    parser.add_argument("--multi30k", default="../shared/data/multi30k")
    parser.add_argument("--work", default="work/bench_hf_cost")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--updates", type=int, default=12)
    parser.add_argument("--warm-up", type=int, default=2, help="updates left out of the time")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--length", type=int, default=64, help="tokens a sequence")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences an update")
    parser.add_argument(
        "--arms",
        nargs="+",
        default=["natbias"],
        choices=["natbias", "natbias-frozen-bias"],
        help="timed against stock (natbias-frozen-bias: the bias held fixed, "
        "to see what its gradient costs)",
    )
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--paired",
        action="store_true",
        help="time update by update in one process, the arms alternating (rounds x updates "
        "pairs), instead of whole Trainer runs alternating round by round",
    )
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    arms = ["stock", *args.arms]
    rows = [
        "| model | arm | seconds per update (median of rounds) | ratio to stock (median of rounds) |",
        "|---|---|---|---|",
    ]
    for family in args.family:
        setup = multi30k_setup(args) if family == "multi30k" else synthetic_setup(family, args)
        if args.profile:
            profile(family, setup, args)
            continue
        if args.paired:
            times = paired(setup, args, arms)
            rows.append(f"| {family} | stock | {statistics.median(times['stock']):.4f} | 1 |")
            for arm in args.arms:
                ratios = [t / s for t, s in zip(times[arm], times["stock"])]
                quartiles = statistics.quantiles(ratios, n=4)
                rows.append(
                    f"| {family} | {arm} | {statistics.median(times[arm]):.4f} | "
                    f"{statistics.median(ratios):.3f}× (quartiles of the {len(ratios)} pairs: "
                    f"{quartiles[0]:.3f}, {quartiles[2]:.3f}) |"
                )
                print(rows[-1], flush=True)
            continue
        times = {arm: [] for arm in arms}
        for round_ in range(args.rounds):
            for arm in arms if round_ % 2 == 0 else arms[::-1]:
                times[arm].append(run_arm(arm, setup, args))
            print(
                f"{family} round {round_ + 1}: "
                + ", ".join(f"{a} {times[a][-1]:.4f} s" for a in arms),
                flush=True,
            )
        rows.append(f"| {family} | stock | {statistics.median(times['stock']):.4f} | 1 |")
        for arm in args.arms:
            ratios = [t / s for t, s in zip(times[arm], times["stock"])]
            listed = ", ".join(f"{r:.3f}" for r in ratios)
            rows.append(
                f"| {family} | {arm} | {statistics.median(times[arm]):.4f} | "
                f"{statistics.median(ratios):.3f}× (rounds: {listed}) |"
            )
    if args.profile:
        return
    how = f"{args.rounds} alternated rounds of {args.updates} updates ({args.warm_up} left out)"
    if args.paired:
        how = f"{args.rounds * args.updates - args.warm_up} pairs of updates, alternating"
    table = "\n".join(
        [
            *rows,
            "",
            f"{how}, {args.batch_size} x {args.length} tokens an update (synthetic models), "
            f"{args.threads} thread(s), torch {torch.__version__}, transformers "
            f"{transformers.__version__}; command: {' '.join(sys.argv)}",
        ]
    )
    print(table)
    if args.out:
        Path(args.out).write_text("# Cost per update in transformers\n\n" + table + "\n")


if __name__ == "__main__":
    main()
