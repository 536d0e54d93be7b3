"""docs/huggingface.md's worked example (a Qwen-style model from scratch with
the Trainer and the natural bias) runs as printed, on a Multi30k slice with
its sizes and update counts made tiny."""

import re

import pytest
from hf_tiny import max_kl_from
from natbias_testing import REPO, write_multi30k_slice

pytest.importorskip("transformers")
pytest.importorskip("tensorboardX")
datasets = pytest.importorskip("datasets")

HEADING = "## Example: a Qwen-style model from scratch"
TINY = {
    '"corpus.txt"': None,  # the slice's path
    "vocab_size=8000": "vocab_size=300",
    "hidden_size=256": "hidden_size=32",
    "intermediate_size=704": "intermediate_size=64",
    "num_hidden_layers=4": "num_hidden_layers=1",
    "max_steps=2000": "max_steps=3",
    "per_device_train_batch_size=32": "per_device_train_batch_size=8",
    "warmup_steps=200": "warmup_steps=1",
    "logging_steps=50": "logging_steps=1",
    'report_to=["tensorboard"]': 'report_to=["tensorboard"], use_cpu=True, disable_tqdm=True',
}


def example_code():
    text = (REPO / "docs" / "huggingface.md").read_text(encoding="utf-8")
    return re.search(re.escape(HEADING) + r"\n\n```python\n(.*?)```", text, re.S).group(1)


@pytest.mark.training
def test_the_worked_example_runs_and_starts_at_the_unigram(tmp_path, monkeypatch):
    write_multi30k_slice(tmp_path, {"train": 300})
    code = example_code()
    for printed, tiny in TINY.items():
        assert printed in code, printed
        code = code.replace(printed, tiny or repr(str(tmp_path / "train.en")))
    # Run it up to the training, check update 0, then train.
    before_training, training = code.split("trainer.train()")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    scope = {}
    exec(before_training, scope)
    model, collator, train = scope["model"], scope["collator"], scope["train"]
    batch = collator(list(train.select(range(16))))
    model.eval()
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    model.train()
    mask = batch["attention_mask"].bool()
    assert max_kl_from(model.natbias_log_prior, logits[mask].detach()) < 1e-3
    exec("trainer.train()" + training, scope)
    logged = [e for e in scope["trainer"].state.log_history if "loss" in e]
    assert len(logged) == 3 and all("bias_kl" in e and "kl_unigram" in e for e in logged)
    assert list(tmp_path.glob("qwen-natbias/runs/*/events.out.tfevents.*"))
    assert (tmp_path / "qwen-natbias/final/config.json").exists()
