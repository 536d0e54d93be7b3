"""Seconds per training update of the natural bias in transformers against
transformers' stock training: the model of examples/huggingface/translate.py
(Marian, 2+2 layers, d 128) on Multi30k De->En, 80 sentence pairs per update,
both arms with transformers' label_smoothing_factor 0.1, through the real
Seq2SeqTrainer (no validation, no saving). The arms alternate, round after
round, so that a change in the machine's speed meets both alike; each
round's ratio is arm / stock, and the median over rounds is reported.

    .venv/bin/python research/bench_hf_cost.py --rounds 5 --updates 60 \\
        --out research/results/hf_cost_per_update.md
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "huggingface"))

import torch  # noqa: E402
import translate  # noqa: E402  (the example's data, tokenizer and model)
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments  # noqa: E402


def seconds_per_update(arm, args, tokenizer, train, out):
    bias = "none" if arm == "stock" else "natural"
    options = translate.parse_args(["--data", args.multi30k, "--bias", bias, "--seed", "1"])
    model = translate.build_model(tokenizer, train, options)
    if arm == "natbias-frozen-bias":  # what the bias's own gradient costs
        model.final_logits_bias.requires_grad_(False)
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    training = Seq2SeqTrainingArguments(
        output_dir=str(out),
        max_steps=args.updates,
        seed=1,
        per_device_train_batch_size=80,
        learning_rate=1e-3,
        lr_scheduler_type="inverse_sqrt",
        warmup_steps=100,
        adam_beta2=0.997,
        max_grad_norm=0.0,
        train_sampling_strategy="group_by_length",
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        logging_steps=10**6,
        label_smoothing_factor=0.1,
        dataloader_num_workers=0,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=training,
        train_dataset=train,
        data_collator=collator,
        processing_class=tokenizer,
    )
    started = time.perf_counter()
    trainer.train()
    return (time.perf_counter() - started) / args.updates


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--multi30k", default="../shared/data/multi30k")
    parser.add_argument("--work", default="work/bench_hf_cost")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--updates", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--arms",
        nargs="+",
        default=["natbias"],
        choices=["natbias", "natbias-frozen-bias"],
        help="timed against stock (natbias-frozen-bias: the bias held fixed, "
        "to see what its gradient costs)",
    )
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    options = translate.parse_args(["--data", args.multi30k])
    tokenizer = translate.train_tokenizer(
        translate.read_split(args.multi30k, "train", "de")
        + translate.read_split(args.multi30k, "train", "en"),
        8000,
        work / "tokenizer",
    )
    train, _, _ = translate.tokenised(tokenizer, args.multi30k, "train", options, 0)
    arms = ["stock", *args.arms]
    times = {arm: [] for arm in arms}
    for round_ in range(args.rounds):
        for arm in arms if round_ % 2 == 0 else arms[::-1]:
            times[arm].append(seconds_per_update(arm, args, tokenizer, train, work / "out"))
        print(
            f"round {round_ + 1}: " + ", ".join(f"{a} {times[a][-1]:.4f} s" for a in arms),
            flush=True,
        )
    rows = [
        "| arm | seconds per update (median of rounds) | ratio to stock (median of rounds) |",
        "|---|---|---|",
        f"| stock | {statistics.median(times['stock']):.4f} | 1 |",
    ]
    for arm in args.arms:
        ratios = [t / s for t, s in zip(times[arm], times["stock"])]
        listed = ", ".join(f"{r:.3f}" for r in ratios)
        rows.append(
            f"| {arm} | {statistics.median(times[arm]):.4f} | "
            f"{statistics.median(ratios):.3f}× (rounds: {listed}) |"
        )
    table = "\n".join(
        [
            *rows,
            "",
            f"{args.rounds} alternated rounds of {args.updates} updates, "
            f"{args.threads} thread(s), torch {torch.__version__}; command: "
            f"{' '.join(sys.argv)}",
        ]
    )
    print(table)
    if args.out:
        Path(args.out).write_text("# Cost per update in transformers\n\n" + table + "\n")


if __name__ == "__main__":
    main()
