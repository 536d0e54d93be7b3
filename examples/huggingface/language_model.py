"""A decoder-only language model from scratch with Hugging Face transformers:
a small GPT-2 trained by ``Trainer`` as transformers' stock training does
it, or with the natural bias.

    python examples/huggingface/language_model.py --data DIR --lang en \\
        --work WORK --bias natural --seed 1

The text of one language (train, val(id), test splits, one sentence a line)
is loaded with 🤗 datasets and tokenised with a unigram tokenizer trained
here, joined into one stream with ``</s>`` after every sentence, and cut into
blocks of --block tokens (fairseq's ``--sample-break-mode none``), as
transformers' run_clm.py does. One run a call, in
WORK/runs/<arm>/seed<k>/ (arm: stock, natbias); validation NLL (bits) at
update 0 and every --eval-every updates, the model of lowest NLL kept and
scored on the test split (NLL and perplexity). Plain cross-entropy, as a
language model is usually trained; --label-smoothing unigram trains with
label smoothing towards the unigram instead.
"""

import argparse
import json
import math
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # before transformers is imported

import torch  # noqa: E402
from common import (  # noqa: E402
    Record,
    ValidationCallback,
    add_run_arguments,
    last_checkpoint,
    load_text,
    record_prior_nll,
    say,
    train_tokenizer,
    validation_nll,
)
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from natbias.hf import (  # noqa: E402
    BiasStatisticsCallback,
    UnigramLabelSmoothingLoss,
    add_natural_bias,
    count_targets,
    from_pretrained,
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", required=True, help="raw text: SPLIT.LANG[.gz] files")
    parser.add_argument("--lang", default="en")
    parser.add_argument("--work", default="work/examples/huggingface-lm")
    parser.add_argument("--train-lines", type=int, default=0, help="first N sentences (0: all)")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--bias", choices=("none", "natural"), default="natural")
    parser.add_argument("--label-smoothing", choices=("none", "unigram"), default="none")
    parser.add_argument("--block", type=int, default=64, help="tokens per block")
    parser.add_argument("--batch-size", type=int, default=24, help="blocks per update")
    add_run_arguments(parser)
    return parser.parse_args(argv)


def arm_name(args):
    return ("natbias" if args.bias == "natural" else "stock") + (
        "+unigram-ls" if args.label_smoothing == "unigram" else ""
    )


def blocks(tokenizer, size):
    """A ``map`` function: the batch's sentences as one stream (each ending
    in </s>) cut into blocks, run_clm.py's group_texts (given the whole split
    as one batch, only its last partial block is dropped)."""

    def group(batch):
        stream = [i for ids in tokenizer(batch["text"])["input_ids"] for i in ids]
        cut = [stream[i : i + size] for i in range(0, len(stream) - size + 1, size)]
        return {"input_ids": cut, "labels": cut}

    return group


def collate(examples):
    return {key: torch.tensor([e[key] for e in examples]) for key in ("input_ids", "labels")}


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    run = work / "runs" / arm_name(args) / f"seed{args.seed}"
    if (run / "done").exists():
        say(f"{run}: done before, skipped")
        return
    run.mkdir(parents=True, exist_ok=True)
    text = load_text(
        args.data, args.lang, ("train", "valid", "test"), work / "datasets",
        {"train": args.train_lines},
    )  # fmt: skip
    tokenizer = train_tokenizer(list(text["train"]["text"]), args.vocab, work / "tokenizer")
    split = text.map(
        blocks(tokenizer, args.block), batched=True, batch_size=None, remove_columns=["text"]
    )
    train, valid, test = split["train"], list(split["valid"]), list(split["test"])
    vocab = len(tokenizer)
    record = Record(run, {**vars(args), "arm": arm_name(args)})
    record_prior_nll(record, train, valid, vocab, causal=True)
    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=vocab,
            n_embd=args.dim,
            n_layer=args.layers,
            n_head=args.heads,
            n_inner=args.ffn,
            n_positions=args.block,
            bos_token_id=tokenizer.eos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    if args.bias == "natural":
        model = add_natural_bias(model, train)  # the datasets.Dataset the Trainer gets
    loss = None
    if args.label_smoothing == "unigram":
        loss = (
            UnigramLabelSmoothingLoss.from_model(model)
            if args.bias == "natural"
            else UnigramLabelSmoothingLoss.from_counts(
                count_targets(train, vocab, causal=True), model
            )
        )
    valid_batches = [collate(valid[i : i + 64]) for i in range(0, len(valid), 64)]
    callbacks = [
        ValidationCallback(
            record, valid_batches, args.eval_every, args.patience, run, tokenizer, causal=True
        )
    ]
    if args.bias == "natural":
        callbacks.append(BiasStatisticsCallback(probe=valid_batches[0]))
    training = TrainingArguments(
        output_dir=str(run / "checkpoints"),
        max_steps=args.max_steps,
        seed=args.seed,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        lr_scheduler_type="inverse_sqrt",
        warmup_steps=args.warmup,
        adam_beta2=0.997,
        weight_decay=0.0,
        max_grad_norm=0.0,
        save_strategy="steps",
        save_steps=args.eval_every,
        save_total_limit=1,
        logging_steps=args.eval_every,
        eval_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=train,
        data_collator=collate,
        compute_loss_func=loss,
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=last_checkpoint(run / "checkpoints"))
    best = (
        from_pretrained(run / "best")
        if args.bias == "natural"
        else GPT2LMHeadModel.from_pretrained(run / "best")
    )
    test_nll = validation_nll(
        best, [collate(test[i : i + 64]) for i in range(0, len(test), 64)], causal=True
    )
    record.update(scores={"test": {"nll": round(test_nll, 4), "ppl": round(2**test_nll, 2)}})
    say(f"test: {test_nll:.3f} bits a token, perplexity {2**test_nll:.2f}")
    (run / "done").write_text(json.dumps(record.get("scores")) + "\n")
    assert math.isfinite(test_nll)


if __name__ == "__main__":
    main()
