"""examples/huggingface/common.py without training: the validation callback's
record, best model and early stopping, on a scripted sequence of NLLs."""

import sys

import pytest
from natbias_testing import REPO

pytest.importorskip("transformers")
sys.path.insert(0, str(REPO / "examples" / "huggingface"))
import common  # noqa: E402
from transformers import TrainerControl, TrainerState  # noqa: E402


class Saved:
    """Stands in for the model and the tokenizer: remembers when it was saved."""

    def __init__(self):
        self.saved_at, self.folders = [], []
        self.update = None

    def save_pretrained(self, folder):
        self.saved_at.append(self.update)
        self.folders.append(folder.name)


def validate_over(nll_by_update, every, patience, tmp_path, monkeypatch, keep=(), model=None):
    """Runs the callback over updates every, 2 every, ...; the NLL at each
    update is scripted. Returns (record, the updates the model was saved at,
    the update at which training was told to stop, or None)."""
    model = model or Saved()
    monkeypatch.setattr(common, "validation_nll", lambda *a, **k: nll_by_update[model.update])
    record = common.Record(tmp_path, {})
    callback = common.ValidationCallback(record, [], every, patience, tmp_path, Saved(), keep=keep)
    state, control = TrainerState(), TrainerControl()
    state.max_steps = max(nll_by_update)
    model.update = state.global_step = 0
    callback.on_train_begin(None, state, control, model=model)
    for step in range(1, state.max_steps + 1):
        model.update = state.global_step = step
        callback.on_step_end(None, state, control, model=model)
        if control.should_training_stop:
            return record, model.saved_at, step
    return record, model.saved_at, None


def test_training_stops_after_patience_validations_without_a_lower_nll(tmp_path, monkeypatch):
    nll = {0: 9.0, 2: 5.0, 4: 4.0, 6: 4.5, 8: 4.0, 10: 4.2, 12: 3.0}
    nll.update({u: 9.9 for u in range(1, 13, 2)})  # never validated
    record, saved, stopped = validate_over(nll, 2, 3, tmp_path, monkeypatch)
    # Best 4.0 at update 4; 8's 4.0 is not lower; 3 validations later (6, 8, 10): stop.
    assert stopped == 10
    assert record["updates"] == [0, 2, 4, 6, 8, 10]
    assert record["nll"] == [9.0, 5.0, 4.0, 4.5, 4.0, 4.2]
    assert (record["best_update"], record["best_nll"]) == (4, 4.0)
    assert saved == [0, 2, 4]  # the best model, each time it improved


def test_patience_zero_runs_to_the_last_update(tmp_path, monkeypatch):
    nll = {u: 5.0 + u for u in range(0, 9)}  # worse at every validation
    record, saved, stopped = validate_over(nll, 4, 0, tmp_path, monkeypatch)
    assert stopped is None
    assert record["updates"] == [0, 4, 8] and saved == [0]


def test_keep_saves_the_model_of_the_updates_asked_for_beside_the_best(tmp_path, monkeypatch):
    nll = {u: 5.0 + u for u in range(0, 9)}  # the best stays update 0's
    model = Saved()
    validate_over(nll, 4, 0, tmp_path, monkeypatch, keep=[4], model=model)
    assert list(zip(model.saved_at, model.folders)) == [(0, "best"), (4, "update-4")]
