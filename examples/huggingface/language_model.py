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
from functools import partial
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # before transformers is imported

import common  # noqa: E402
import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from natbias.hf import add_natural_bias  # noqa: E402


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
    common.add_run_arguments(parser)
    return parser.parse_args(argv)


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
    work, run = Path(args.work), common.run_folder(args)
    if run is None:
        return
    text = common.load_text(
        args.data, args.lang, ("train", "valid", "test"), work / "datasets",
        {"train": args.train_lines},
    )  # fmt: skip
    tokenizer = common.train_tokenizer(list(text["train"]["text"]), args.vocab, work / "tokenizer")
    split = text.map(
        blocks(tokenizer, args.block), batched=True, batch_size=None, remove_columns=["text"]
    )
    train, valid, test = split["train"], list(split["valid"]), list(split["test"])
    vocab = len(tokenizer)
    record = common.Record(run, {**vars(args), "arm": common.arm_name(args)})
    common.record_prior_nll(record, train, valid, vocab, causal=True)
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
    valid_batches = [collate(valid[i : i + 64]) for i in range(0, len(valid), 64)]
    training = TrainingArguments(**common.training_arguments(args, run))
    trainer = partial(Trainer, args=training)
    common.train_model(args, run, record, model, train, collate, valid_batches, tokenizer, trainer)
    best = common.best_model(args, run, GPT2LMHeadModel)
    test_nll = common.validation_nll(
        best, [collate(test[i : i + 64]) for i in range(0, len(test), 64)], causal=True
    )
    record.update(scores={"test": {"nll": round(test_nll, 4), "ppl": round(2**test_nll, 2)}})
    common.say(f"test: {test_nll:.3f} bits a token, perplexity {2**test_nll:.2f}")
    (run / "done").write_text(json.dumps(record.get("scores")) + "\n")
    assert math.isfinite(test_nll)


if __name__ == "__main__":
    main()
