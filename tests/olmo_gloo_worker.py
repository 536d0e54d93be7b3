"""One update of OLMo-core's 1M preset with the natural bias, as OLMo-core's
Trainer runs it: on one process (tests/test_olmo_core.py), and on each of 2
gloo processes under FSDP, HSDP and tensor parallelism (``run_all``, started
by olmo_core.testing's ``run_distributed_test``), with bf16 mixed precision,
and resumed from OLMo-core's distributed checkpoint."""

import json
import os

import numpy as np
import olmo_tiny
import torch

from natbias.olmo_core import NaturalBiasCallback, add_natural_bias
from natbias.sharding import full, is_dtensor

BATCH = 8  # instances an update, over all data-parallel processes
LR = 1e-2


def recorder():
    """An OLMo-core callback keeping every step's metrics as the trainer hands them out."""
    from olmo_core.train.callbacks import Callback

    class _Recorder(Callback):
        def __init__(self):
            self.steps, self.taken = {}, []

        def log_metrics(self, step, metrics):
            self.steps.setdefault(step, {}).update(metrics)

        def post_step(self):
            self.taken.append(self.trainer.global_step)

    return _Recorder()


def probe(paths) -> torch.Tensor:
    """A fixed batch: the validation file's first BATCH instances."""
    ids = np.fromfile(paths["val"], dtype=np.uint16)[: BATCH * olmo_tiny.SEQUENCE_LENGTH]
    return torch.from_numpy(ids.astype(np.int64)).view(BATCH, -1)


def probe_loss(model, ids) -> float:
    """OLMo-core's loss on ``ids`` (the same batch on every process), summed
    then divided by the number of targets: its "mean" under tensor
    parallelism is the mean of each sequence shard's mean."""
    from olmo_core.data.utils import get_labels

    labels = get_labels({"input_ids": ids})
    with torch.no_grad():
        loss = model(ids, labels=labels, loss_reduction="sum").loss
    resharded(model)
    return float(full(loss).item()) / int((labels != -100).sum())


def resharded(model):
    """FSDP's modules back to their shards (the head stays whole after a
    forward: OLMo-core shards it with reshard_after_forward=False)."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    return model


def head_state(model, natural=True) -> dict:
    head = model.lm_head.w_out
    local = head.weight.to_local() if is_dtensor(head.weight) else head.weight
    if not natural:
        return {"weight_local": local.numel(), "weight_full": head.weight.numel()}
    return {
        "bias": full(head.bias.detach()).float().tolist(),
        "gain_param": full(head.gain_param.detach()).float().tolist(),
        "bias_dtype": str((head.bias.to_local() if is_dtensor(head.bias) else head.bias).dtype),
        "weight_local": local.numel(),
        "weight_full": head.weight.numel(),
    }


def one_run(
    paths,
    folder,
    steps=1,
    load_path=None,
    save_interval=None,
    initial=None,
    natural=True,
    **parallel,
) -> dict:
    """A fresh model given the natural bias, trained ``steps`` updates by
    OLMo-core's Trainer (or resumed from ``load_path``): the probe's loss
    before and after, the head, and the natbias metrics of the last step.
    ``initial``: a file of the whole model's initial state to start from
    (OLMo-core's init draws other numbers for sharded parameters); without
    one, the model's initial state is written to ``folder/initial.pt``."""
    import olmo_core.distributed.parallel as olmo_parallel
    from olmo_core.train import LoadStrategy
    from olmo_core.train.callbacks import CheckpointerCallback

    olmo_parallel._WORLD_MESH = None  # one train module per run, several runs per process
    model = olmo_tiny.model_1m(meta=True)
    dataset = olmo_tiny.dataset_config([paths["train"]], f"{folder}-work").build()
    if natural:
        add_natural_bias(model, dataset)
    micro = BATCH // (
        2 if "dp_config" in parallel and "tp_config" not in parallel else 1
    )  # each data-parallel process's share
    module = olmo_tiny.train_module(model, lr=LR, warmup=None, batch=micro, **parallel)
    if initial is None:
        torch.save(model.state_dict(), f"{folder}-initial.pt")
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        state = torch.load(initial)
        set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))
    sharding = head_state(model, natural)  # as the train module left it
    ids = probe(paths)
    before = probe_loss(model, ids)
    metrics = recorder()
    callbacks = [("natbias", NaturalBiasCallback(enabled=natural)), ("recorder", metrics)]
    # no_checkpoints also turns off loading (OLMo-core's fit loads only with
    # checkpoints on): a run given load_path keeps them on, or it starts afresh.
    no_checkpoints = save_interval is None and load_path is None
    options = dict(async_bookkeeping=False, no_checkpoints=no_checkpoints)
    if save_interval is not None:
        checkpointer = CheckpointerCallback(save_interval=save_interval, save_async=False)
        callbacks.append(("checkpointer", checkpointer))
    if load_path is not None:
        options.update(load_path=str(load_path), load_strategy=LoadStrategy.always)
    trainer = olmo_tiny.trainer(module, dataset, folder, steps, callbacks, batch=BATCH, **options)
    trainer.fit()
    metrics = trainer.callbacks["recorder"]  # the trainer's own (its config may copy callbacks)
    last = {}
    for step in sorted(metrics.steps):  # the last step's natbias metrics
        last.update({k: v for k, v in metrics.steps[step].items() if k.startswith("natbias/")})
    return {
        "before": before,
        "after": probe_loss(model, ids),
        "step": trainer.global_step,
        "steps_taken": metrics.taken,  # a resumed run's: those after its checkpoint
        "natbias": last,
        **head_state(resharded(model), natural),
        "sharded": [sharding["weight_local"], sharding["weight_full"]],
    }


def modes():
    from olmo_core.config import DType
    from olmo_core.distributed.parallel import DataParallelType
    from olmo_core.train.train_module import (
        TransformerDataParallelConfig,
        TransformerTensorParallelConfig,
    )

    return {
        "fsdp": dict(dp_config=TransformerDataParallelConfig(name=DataParallelType.fsdp)),
        "hsdp": dict(
            dp_config=TransformerDataParallelConfig(
                name=DataParallelType.hsdp, num_replicas=2, shard_degree=1
            )
        ),
        "tp": dict(  # OLMo-core wants a data-parallel config beside TP: degree 2 / 2 = 1
            dp_config=TransformerDataParallelConfig(name=DataParallelType.fsdp),
            tp_config=TransformerTensorParallelConfig(degree=2),
        ),
        "fsdp_bf16": dict(
            dp_config=TransformerDataParallelConfig(
                name=DataParallelType.fsdp, param_dtype=DType.bfloat16
            )
        ),
    }


def run_all(paths, root, out, initial):
    """Every mode on this process group; rank 0 writes the figures to ``out``."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    only = os.environ.get("OLMO_GLOO_MODES")  # a subset, to debug one
    results = {
        name: one_run(paths, f"{root}/{name}", initial=initial, **kw)
        for name, kw in modes().items()
        if not only or name in only.split(",")
    }
    fsdp = modes()["fsdp"]
    # OLMo-core 3.0's run that saves a checkpoint goes on differently from one
    # that does not (stock models too): the resumed run is compared with the
    # run that saved the checkpoint it resumes and went on.
    a, b = (f"{root}/{name}" for name in "ab")
    results["saved"] = one_run(paths, a, 2, save_interval=1, initial=initial, **fsdp)
    results["resumed"] = one_run(paths, b, 2, load_path=f"{a}/step1", initial=initial, **fsdp)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":  # python olmo_gloo_worker.py TRAIN VAL ROOT OUT: 2 gloo processes
    import sys

    from olmo_core.testing.distributed import run_distributed_test

    train, val, root, out, initial = sys.argv[1:]
    paths = {"train": train, "val": val}
    args = (paths, root, out, initial)
    run_distributed_test(run_all, world_size=2, backend="gloo", func_args=args)
