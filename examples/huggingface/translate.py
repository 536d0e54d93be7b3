"""Translation from scratch with Hugging Face transformers: a small Marian
model trained by ``Seq2SeqTrainer`` as transformers' stock training does it,
or with the natural bias, or with label smoothing towards the unigram.

    python examples/huggingface/translate.py --data DIR --src de --tgt en \\
        --work WORK --bias natural --label-smoothing unigram --seed 1

One run a call, in WORK/runs/<arm>/seed<k>/ (arm: stock, natbias,
stock+unigram-ls, natbias+unigram-ls); the data, its tokenizer (a unigram
model of --vocab pieces on both languages, trained here) and the tokenised
splits are shared by the runs in WORK. Each run records validation NLL (bits)
at update 0 and every --eval-every updates, keeps the model of lowest NLL,
stops after --patience validations without a lower one (0: at --max-steps),
then translates the test sets with it (beam 5) and scores them with
sacreBLEU (BLEU and chrF, with signatures). A finished run is skipped, an
interrupted one resumes from its last checkpoint.
"""

import argparse
import json
import os
from functools import partial
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # before transformers is imported

import torch  # noqa: E402
from common import (  # noqa: E402
    Record,
    add_run_arguments,
    arm_name,
    best_model,
    load_text,
    read_split,
    record_prior_nll,
    run_folder,
    say,
    train_model,
    train_tokenizer,
    training_arguments,
)
from quality import quality  # noqa: E402
from transformers import (  # noqa: E402
    DataCollatorForSeq2Seq,
    MarianConfig,
    MarianMTModel,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)

from natbias.hf import add_natural_bias  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data",
        required=True,
        help="raw parallel text: train, val(id), test "
        "files as SPLIT.LANG[.gz] (Multi30k's names or train/valid/test)",
    )
    parser.add_argument("--src", default="de")
    parser.add_argument("--tgt", default="en")
    parser.add_argument("--work", default="work/examples/huggingface")
    parser.add_argument("--train-pairs", type=int, default=0, help="first N pairs only (0: all)")
    parser.add_argument(
        "--eval-lines", type=int, default=0, help="first N validation and test pairs only (0: all)"
    )
    parser.add_argument(
        "--test-sets",
        nargs="*",
        default=["test"],
        help="test splits to score (e.g. test test_2017_flickr)",
    )
    parser.add_argument("--vocab", type=int, default=8000, help="tokenizer vocabulary size")
    parser.add_argument(
        "--bias",
        choices=("none", "natural"),
        default="natural",
        help="natural: natbias.hf.add_natural_bias; none: transformers' stock",
    )
    parser.add_argument(
        "--label-smoothing",
        choices=("uniform", "unigram"),
        default="uniform",
        help="uniform: transformers' label_smoothing_factor 0.1; unigram: "
        "natbias.hf.UnigramLabelSmoothingLoss, epsilon 0.1",
    )
    parser.add_argument("--batch-size", type=int, default=80, help="sentence pairs per update")
    parser.add_argument("--beam", type=int, default=5)
    add_run_arguments(parser, "encoder and decoder layers")
    return parser.parse_args(argv)


def load_pairs(args, work):
    """The training and validation pairs as 🤗 datasets (columns source and
    target), each language's file loaded with ``load_dataset("text")``."""
    splits, limits = ("train", "valid"), {"train": args.train_pairs, "valid": args.eval_lines}
    source = load_text(args.data, args.src, splits, work / "datasets", limits)
    target = load_text(args.data, args.tgt, splits, work / "datasets", limits)
    return {
        split: source[split]
        .rename_column("text", "source")
        .add_column("target", list(target[split]["text"]))
        for split in splits
    }


def tokenise(tokenizer):
    """A ``map`` function: each pair's ids, the source in, the target as labels."""

    def pairs(batch):
        return {
            key: tokenizer(batch[column], truncation=True, max_length=256)["input_ids"]
            for key, column in (("input_ids", "source"), ("labels", "target"))
        }

    return pairs


def marian_config(tokenizer, args):
    """The study's size (2+2 layers, d 128, FFN 256, 4 heads; ReLU and scaled
    embeddings as fairseq's transformer), one vocabulary tied everywhere."""
    ids = dict(
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        forced_eos_token_id=tokenizer.eos_token_id,
    )
    return MarianConfig(
        vocab_size=len(tokenizer),
        d_model=args.dim,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.ffn,
        decoder_ffn_dim=args.ffn,
        max_position_embeddings=256,
        activation_function="relu",
        scale_embedding=True,
        dropout=0.1,
        **ids,
    )


def build_model(tokenizer, train, args):
    torch.manual_seed(args.seed)
    model = MarianMTModel(marian_config(tokenizer, args))
    if args.bias == "natural":
        model = add_natural_bias(model, train)  # the datasets.Dataset the Trainer gets
    return model


def train_run(args, run, tokenizer, train, valid):
    model = build_model(tokenizer, train, args)
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    record = Record(run, {**vars(args), "arm": arm_name(args)})
    record_prior_nll(record, train, valid, len(tokenizer))
    valid_batches = [collator(valid[i : i + 128]) for i in range(0, len(valid), 128)]
    smoothing = 0.1 if args.label_smoothing == "uniform" else 0.0
    training = Seq2SeqTrainingArguments(
        **training_arguments(
            args, run, train_sampling_strategy="group_by_length", label_smoothing_factor=smoothing
        )
    )
    trainer = partial(Seq2SeqTrainer, args=training, processing_class=tokenizer)
    trainer = train_model(
        args, run, record, model, train, collator, valid_batches, tokenizer, trainer
    )
    record.update(
        log_history=[
            entry for entry in trainer.state.log_history if "bias_kl" in entry or "loss" in entry
        ]
    )
    return record


@torch.no_grad()
def translate(model, tokenizer, sources, beam, batch_size=64):
    """Beam-search translations of ``sources``, detokenised, in their order
    (batched by length for speed)."""
    model.eval()
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    output = [None] * len(sources)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        inputs = tokenizer([sources[i] for i in batch], return_tensors="pt", padding=True)
        generated = model.generate(
            **inputs,
            num_beams=beam,
            max_new_tokens=int(inputs["input_ids"].shape[1] * 1.2) + 10,
            length_penalty=1.0,
        )
        for i, text in zip(batch, tokenizer.batch_decode(generated, skip_special_tokens=True)):
            output[i] = text.strip()
    return output


def score(args, run, tokenizer, record):
    model = best_model(args, run, MarianMTModel)
    scores = {}
    for test_set in args.test_sets:
        sources = read_split(args.data, test_set, args.src, args.eval_lines)
        references = read_split(args.data, test_set, args.tgt, args.eval_lines)
        hypotheses = translate(model, tokenizer, sources, args.beam)
        (run / f"{test_set}.hyp").write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
        scores[test_set] = quality(hypotheses, references)
        say(
            f"{test_set}: BLEU {scores[test_set]['BLEU']:.2f}, chrF "
            f"{scores[test_set]['chrF']:.2f} ({scores[test_set]['bleu_signature']})"
        )
    record.update(scores=scores)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    work, run = Path(args.work), run_folder(args)
    if run is None:
        return
    pairs = load_pairs(args, work)
    texts = list(pairs["train"]["source"]) + list(pairs["train"]["target"])
    tokenizer = train_tokenizer(texts, args.vocab, work / "tokenizer")
    train, valid = (
        pairs[split].map(tokenise(tokenizer), batched=True, remove_columns=["source", "target"])
        for split in ("train", "valid")
    )
    valid = list(valid)  # examples, for the collator's validation batches
    say(
        f"{run}: {len(train)} training pairs, vocabulary {len(tokenizer)}, "
        f"{args.max_steps} updates at most"
    )
    record = train_run(args, run, tokenizer, train, valid)
    score(args, run, tokenizer, record)
    (run / "done").write_text(json.dumps(record.get("scores")) + "\n")


if __name__ == "__main__":
    main()
