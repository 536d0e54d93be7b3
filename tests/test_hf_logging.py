"""The bias statistics reach the Trainer's report_to integrations: read back
from the TensorBoard event files the real Trainer writes, once per log, in
one process and under torchrun (2 CPU processes: the main one alone)."""

import json
import os
import struct
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tensorboardX")
from hf_tiny import build, zipf_targets  # noqa: E402
from natbias_testing import script_python  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

import natbias.hf  # noqa: E402
from natbias.hf.callback import statistics  # noqa: E402

STATISTICS = ("bias_kl", "bias_norm", "weight_norm", "gain", "kl_unigram", "kl_uniform")
HERE = Path(__file__).parent


def read_scalars(folder):
    """{tag: [(step, value), ...]} of every TensorBoard event file under
    ``folder``: TFRecords (length, its CRC, an Event, its CRC), parsed with
    tensorboardX's own protobuf classes."""
    from tensorboardX.proto import event_pb2

    scalars = {}
    files = sorted(Path(folder).rglob("events.out.tfevents.*"))
    for path in files:
        data, position = path.read_bytes(), 0
        while position < len(data):
            (length,) = struct.unpack("<Q", data[position : position + 8])
            event = event_pb2.Event.FromString(data[position + 12 : position + 12 + length])
            position += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars, files


def collate(features):
    width = max(len(f["input_ids"]) for f in features)
    ids = torch.tensor([f["input_ids"] + [0] * (width - len(f["input_ids"])) for f in features])
    return {
        "input_ids": ids,
        "attention_mask": ids.ne(0).long(),
        "labels": ids.masked_fill(ids.eq(0), -100),
    }


def trainer_for(tmp_path, callbacks=()):
    model = natbias.hf.add_natural_bias(build("gpt2"), zipf_targets())
    data = [{"input_ids": t} for t in zipf_targets(64, seed=1)]
    args = TrainingArguments(
        output_dir=str(tmp_path / "checkpoints"),
        report_to=["tensorboard"],
        max_steps=3,
        logging_steps=1,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=data, data_collator=collate, callbacks=list(callbacks)
    )
    return trainer, collate(data[:8])


@pytest.mark.training
def test_tensorboard_records_the_statistics_once_per_log(tmp_path):
    trainer, probe = trainer_for(tmp_path)
    natbias.hf.log_bias_statistics(trainer, probe)
    trainer.train()
    scalars, files = read_scalars(tmp_path / "checkpoints")
    assert len(files) == 1
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["step"] for entry in logged] == [1, 2, 3]
    for key in STATISTICS:
        assert [step for step, _ in scalars[f"train/{key}"]] == [1, 2, 3], key
        for (_, value), entry in zip(scalars[f"train/{key}"], logged):
            assert value == pytest.approx(entry[key], rel=1e-6, abs=1e-6), key
    # The last values are the trained model's, computed afresh.
    fresh = statistics(trainer.model, probe)
    for key in STATISTICS:
        assert scalars[f"train/{key}"][-1][1] == pytest.approx(fresh[key], abs=2e-4), key
    assert scalars["train/gain"][0][1] != scalars["train/gain"][-1][1]  # it trained


@pytest.mark.training
def test_given_in_callbacks_it_warns_that_the_integrations_do_not_see_it(tmp_path):
    trainer, _ = trainer_for(tmp_path, [natbias.hf.BiasStatisticsCallback()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    assert sum("log_bias_statistics(trainer)" in str(w.message) for w in caught) == 1
    scalars, _ = read_scalars(tmp_path / "checkpoints")
    assert "train/loss" in scalars and "train/bias_kl" not in scalars
    assert all("bias_kl" in e for e in trainer.state.log_history if "loss" in e)


@pytest.mark.training
def test_under_torchrun_the_main_process_alone_logs_them(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{HERE}{os.pathsep}{HERE.parent}"}
    done = subprocess.run(
        [script_python(), "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone"]
        + [str(HERE / "hf_torchrun_statistics.py"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    histories = [json.loads((tmp_path / f"log_history.{r}.json").read_text()) for r in (0, 1)]
    assert all("bias_kl" in e for e in histories[0] if "loss" in e)
    assert not any("bias_kl" in e for e in histories[1])  # computed by the main process alone
    scalars, files = read_scalars(tmp_path / "checkpoints")
    assert len(files) == 1
    for key in STATISTICS:
        assert [step for step, _ in scalars[f"train/{key}"]] == [1, 2, 3], key
    # What the main process logged last is the saved model's statistics.
    model = natbias.hf.from_pretrained(tmp_path / "model")
    probe = collate([{"input_ids": t} for t in zipf_targets(64, seed=1)][:8])
    fresh = statistics(model, probe)
    for key in STATISTICS:
        assert scalars[f"train/{key}"][-1][1] == pytest.approx(fresh[key], abs=2e-4), key
