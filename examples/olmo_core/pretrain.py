"""Pretrain an OLMo-core preset from scratch, stock or with the natural bias,
as OLMo-core trains it (its AdamW, linear warm-up then cosine, its Trainer),
on one process. docs/pretraining.md shows the commands.

    python examples/olmo_core/pretrain.py --arm natural --out runs/natural
    python examples/olmo_core/pretrain.py --arm stock   --out runs/stock

Data: ``--data DIR`` with OLMo-core numpy token files ``train.npy`` and
``val.npy`` (uint16 ids) and ``--vocab`` their tokenizer's size; without it,
Multi30k English (``NATBIAS_MULTI30K``, or ../shared/data/multi30k) is
tokenised here with a SentencePiece model trained here. The validation
cross-entropy (bits per target token) is measured at step 0 and every
``--eval-every`` steps, and written with the run's figures to
``OUT/results.json``.
"""

import argparse
import gzip
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch

EOS = 1


def tokenise_multi30k(out: Path, vocab: int) -> Path:
    """train.npy and val.npy of Multi30k English under ``out/data``."""
    import sentencepiece as spm

    source = Path(
        os.environ.get("NATBIAS_MULTI30K", Path(__file__).parents[3] / "shared/data/multi30k")
    )
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)

    def read(name):
        with gzip.open(source / f"{name}.en.gz", "rt", encoding="utf-8") as f:
            return [line.strip() for line in f]

    train, val = read("train"), read("val")
    (data / "spm.txt").write_text("\n".join(train) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(data / "spm.txt"), model_prefix=str(data / "spm"), vocab_size=vocab,
        model_type="unigram", character_coverage=1.0, bos_id=-1, eos_id=EOS, pad_id=-1,
        unk_id=0, minloglevel=2, num_threads=1,
    )  # fmt: skip
    model = spm.SentencePieceProcessor(model_file=str(data / "spm.model"))
    for name, lines in (("train", train), ("val", val)):
        ids = [np.array([*pieces, EOS], dtype=np.uint16) for pieces in model.encode(lines)]
        np.concatenate(ids).tofile(data / f"{name}.npy")
    return data


def validation_bits(model, ids: torch.Tensor) -> float:
    from olmo_core.data.utils import get_labels

    training = model.training
    model.eval()
    with torch.no_grad():
        loss = model(ids, labels=get_labels({"input_ids": ids})).ce_loss.item()
    model.train(training)
    return loss / math.log(2)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arm", choices=("stock", "natural"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", type=Path, help="folder of train.npy and val.npy")
    parser.add_argument("--vocab", type=int, default=1000, help="the tokenizer's size")
    parser.add_argument("--preset", default="olmo2_1M", help="a TransformerConfig preset")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=16, help="instances per step")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--lr", type=float, default=4e-3)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=25)
    args = parser.parse_args(argv)

    from olmo_core.data import NumpyDataLoaderConfig, NumpyFSLDatasetConfig, TokenizerConfig
    from olmo_core.nn.transformer import TransformerConfig
    from olmo_core.optim import AdamWConfig, CosWithWarmup, OptimGroupOverride
    from olmo_core.train import (
        Duration,
        TrainerConfig,
        prepare_training_environment,
        teardown_training_environment,
    )
    from olmo_core.train.callbacks import Callback, ConsoleLoggerCallback
    from olmo_core.train.train_module import TransformerTrainModuleConfig

    import natbias.olmo_core

    args.out.mkdir(parents=True, exist_ok=True)
    data = args.data or tokenise_multi30k(args.out, args.vocab)
    prepare_training_environment(seed=args.seed, backend=None)
    tokenizer = TokenizerConfig(vocab_size=args.vocab, eos_token_id=EOS, pad_token_id=0)
    dataset = NumpyFSLDatasetConfig(
        tokenizer=tokenizer, paths=[str(data / "train.npy")], sequence_length=args.seq_len,
        work_dir=str(args.out / "work"),
    ).build()  # fmt: skip
    model_config = getattr(TransformerConfig, args.preset)(
        vocab_size=tokenizer.padded_vocab_size(), init_seed=args.seed
    )
    model = model_config.build(init_device="meta")
    if args.arm == "natural":
        natbias.olmo_core.add_natural_bias(model, dataset)
    no_decay = ["embeddings.weight", "lm_head.w_out.bias", "lm_head.w_out.gain_param"]
    names = {name for name, _ in model.named_parameters()}
    module = TransformerTrainModuleConfig(
        rank_microbatch_size=args.batch * args.seq_len,
        max_sequence_length=args.seq_len,
        optim=AdamWConfig(
            lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95),
            group_overrides=[OptimGroupOverride(
                params=[n for n in no_decay if n in names], opts=dict(weight_decay=0.0)
            )],
        ),
        scheduler=CosWithWarmup(warmup=args.warmup),
        max_grad_norm=1.0,
    ).build(model, device=torch.device("cpu"))  # fmt: skip
    loader = NumpyDataLoaderConfig(
        global_batch_size=args.batch * args.seq_len, seed=args.seed, num_workers=0,
        work_dir=str(args.out / "work"),
    ).build(dataset)  # fmt: skip

    val = torch.from_numpy(np.fromfile(data / "val.npy", dtype=np.uint16).astype(np.int64))
    val = val[: val.numel() // args.seq_len * args.seq_len].view(-1, args.seq_len)
    curve, train_curve = {}, {}

    class Validation(Callback):
        def pre_train(self):
            curve[0] = validation_bits(self.trainer.train_module.model, val)

        def post_step(self):
            if self.step % args.eval_every == 0 or self.step == args.steps:
                curve[self.step] = validation_bits(self.trainer.train_module.model, val)

        def log_metrics(self, step, metrics):
            if "train/CE loss" in metrics:
                train_curve[step] = metrics["train/CE loss"] / math.log(2)

    console = ConsoleLoggerCallback(log_interval=args.eval_every)
    console.metrics.append("natbias/*")  # NaturalBiasCallback's: its default list leaves them out
    trainer = (
        TrainerConfig(
            save_folder=str(args.out / "checkpoints"), save_overwrite=True, device="cpu",
            max_duration=Duration.steps(args.steps), metrics_collect_interval=1,
            cancel_check_interval=10_000, no_checkpoints=True,
        )
        .with_callback("natbias", natbias.olmo_core.NaturalBiasCallback(enabled=args.arm == "natural"))
        .with_callback("validation", Validation())
        .with_callback("console", console)
        .build(module, loader)
    )  # fmt: skip
    start = time.time()
    trainer.fit()
    results = {
        "arm": args.arm, "preset": args.preset, "seed": args.seed, "steps": args.steps,
        "batch": args.batch, "seq_len": args.seq_len, "lr": args.lr, "warmup": args.warmup,
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_tokens": int(np.fromfile(data / "train.npy", dtype=np.uint16).size),
        "validation_bits": curve, "train_bits": train_curve, "seconds": time.time() - start,
    }  # fmt: skip
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(
        f"{args.arm}: validation {curve[0]:.4f} bits at step 0, {curve[args.steps]:.4f} at {args.steps}"
    )
    teardown_training_environment()


if __name__ == "__main__":
    main()
