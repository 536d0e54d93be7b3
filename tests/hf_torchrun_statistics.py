"""Run by tests/test_hf_logging.py under torchrun (2 CPU processes, gloo): a
tiny natural-bias GPT-2 trained 3 updates by the real Trainer, the bias
statistics logged with natbias.hf.log_bias_statistics to TensorBoard.
Each process writes its own log_history to OUT/log_history.<rank>.json;
the main process saves the model to OUT/model.

    torchrun --nproc_per_node 2 tests/hf_torchrun_statistics.py OUT
"""

import json
import sys
from pathlib import Path

import torch
from hf_tiny import build, zipf_targets
from transformers import Trainer, TrainingArguments

import natbias.hf


def collate(features):
    width = max(len(f["input_ids"]) for f in features)
    ids = torch.tensor([f["input_ids"] + [0] * (width - len(f["input_ids"])) for f in features])
    labels = ids.masked_fill(ids.eq(0), -100)
    return {"input_ids": ids, "attention_mask": ids.ne(0).long(), "labels": labels}


def main(out):
    torch.set_num_threads(1)
    model = natbias.hf.add_natural_bias(build("gpt2"), zipf_targets())
    data = [{"input_ids": t} for t in zipf_targets(64, seed=1)]
    args = TrainingArguments(
        output_dir=str(out / "checkpoints"),
        report_to=["tensorboard"],
        max_steps=3,
        logging_steps=1,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        use_cpu=True,
        ddp_backend="gloo",
        save_strategy="no",
        disable_tqdm=True,
        seed=1,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=collate)
    natbias.hf.log_bias_statistics(trainer, probe=collate(data[:8]))
    trainer.train()
    rank = trainer.args.process_index
    (out / f"log_history.{rank}.json").write_text(json.dumps(trainer.state.log_history))
    if trainer.is_world_process_zero():
        model.save_pretrained(out / "model")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
