"""One transformers Trainer run of a tiny GPT-2 on 8 fixed sequences an update:
imported by tests/test_hf_scale_out.py for one process, run as a script by
torchrun for several. Writes what the test compares to ``--out``:
``log_history`` (rank 0's and rank 1's), the gradient of every update (rank
0), and what each rank printed.

    python -m torch.distributed.run --nproc_per_node 2 tests/hf_scale_worker.py \
        --out DIR --batch 4 --accumulation 1

The sequences are synthetic token ids drawn from a Zipf-like law (fixed
seed), 12 tokens each, no padding: every update has the same 88 target
tokens whatever the split, so the runs compare exactly.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
)

from natbias.hf import UnigramLabelSmoothingLoss, add_natural_bias, log_bias_statistics
from natbias.hf.callback import statistics

VOCAB = 48
SEQUENCES = 16  # two updates an epoch of 8 sequences
LENGTH = 12
UPDATE = 8  # sequences an update: batch x accumulation x processes


def sequences(seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, VOCAB + 1)
    ids = rng.choice(VOCAB, size=(SEQUENCES, LENGTH), p=weights / weights.sum())
    return [{"input_ids": torch.tensor(row), "labels": torch.tensor(row)} for row in ids]


def model(natural_bias: bool = True):
    torch.manual_seed(1)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=LENGTH,
        n_embd=16,
        n_layer=1,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    stock = GPT2LMHeadModel(config)
    if not natural_bias:
        return stock
    return add_natural_bias(stock, [item["input_ids"].tolist() for item in sequences()])


class RecordGradients(TrainerCallback):
    """Every parameter's gradient as the optimizer is about to step (after
    DDP's reduction, before clipping), flattened in the model's order; and
    each logged update's bias statistics unrounded (the log's are rounded to
    4 decimals), in its log entry as "unrounded"."""

    def __init__(self):
        self.gradients = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        grads = [p.grad.detach().reshape(-1) for p in model.parameters() if p.grad is not None]
        self.gradients.append(torch.cat(grads).clone())

    def on_log(self, args, state, control, model=None, logs=None, **kwargs):
        if "loss" in (logs or {}) and hasattr(model, "natbias_log_prior"):
            state.log_history[-1]["unrounded"] = statistics(model, digits=None)


def train(
    out,
    batch: int,
    accumulation: int,
    steps: int = 4,
    natural_bias: bool = True,
    save_steps: int = 0,
    resume: str = None,
):
    """Trains and returns (log_history, gradients). The global update is
    ``batch x accumulation x processes`` sequences, in their order."""
    net = model(natural_bias)
    if natural_bias:
        loss = UnigramLabelSmoothingLoss.from_model(net, epsilon=0.1)
    else:
        counts = np.bincount(
            [t for item in sequences() for t in item["input_ids"][1:].tolist()], minlength=VOCAB
        )
        loss = UnigramLabelSmoothingLoss.from_counts(counts, net, epsilon=0.1)
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=accumulation,
        max_steps=steps,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        logging_steps=1,
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        save_only_model=False,
        train_sampling_strategy="sequential",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", 1)) > 1 else None,
    )
    gradients = RecordGradients()
    trainer = Trainer(
        model=net,
        args=args,
        train_dataset=sequences(),
        data_collator=default_data_collator,
        compute_loss_func=loss,
        callbacks=[gradients],
    )
    if natural_bias:
        log_bias_statistics(trainer)
    trainer.train(resume_from_checkpoint=resume)
    return trainer.state.log_history, gradients.gradients


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--accumulation", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--save-steps", type=int, default=0)
    parser.add_argument("--resume")
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", 0))
    history, gradients = train(
        Path(args.out) / "trainer",
        args.batch,
        args.accumulation,
        args.steps,
        save_steps=args.save_steps,
        resume=args.resume,
    )
    Path(args.out, f"history_rank{rank}.json").write_text(json.dumps(history))
    if rank == 0:
        torch.save(gradients, Path(args.out, "gradients.pt"))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
