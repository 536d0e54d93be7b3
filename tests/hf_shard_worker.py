"""Natural-bias models trained sharded, as their users shard them: FSDP2
(``fully_shard``), FSDP1 (``FullyShardedDataParallel``, ``use_orig_params``),
transformers' tensor parallelism (``tp_plan="auto"``), and a model built on
the meta device, given the natural bias there, sharded, then materialised.
Run by torchrun (2 processes, gloo, CPU) for tests/test_hf_sharding.py, which
trains the same models in one process (:func:`train` with ``world=1``) and
compares. Each run writes, from rank 0, ``DIR/<case>.pt``: the loss of every
update, b, the gain and W after the last, the bias statistics, and what shows
that the parameters really were sharded.

    python -m torch.distributed.run --nproc_per_node 2 tests/hf_shard_worker.py DIR

Every process takes a slice of the same global batch (tensor parallelism: the
whole batch on each), and the loss is the token sum over the global batch's
target tokens, as the Trainer computes it: the same update whatever the split.
"""

import os
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hf_tiny  # noqa: E402

import natbias.hf  # noqa: E402
from natbias.errors import NaturalBiasError  # noqa: E402
from natbias.hf import UnigramLabelSmoothingLoss, add_natural_bias  # noqa: E402
from natbias.hf.callback import BiasStatisticsCallback, statistics  # noqa: E402
from natbias.sharding import full, is_dtensor  # noqa: E402

SEQUENCES, LENGTH, UPDATES = 8, 10, 3
# case -> (family, engine); the families' tiny configurations from tests/hf_tiny.py
CASES = {
    "fsdp2-llama": ("llama", "fsdp2"),
    "fsdp2-marian": ("marian", "fsdp2"),
    "fsdp1-gpt2": ("gpt2", "fsdp1"),
    "tp-llama": ("llama", "tp"),
    "meta-fsdp2-llama": ("llama", "meta-fsdp2"),
}
# Without dropout, whose random masks no two splits of a batch draw alike; Llama
# with 2 key-value heads, so that tensor parallelism can split them over 2 processes.
SETTINGS = {
    "llama": {"num_key_value_heads": 2},
    "marian": {"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0},
    "gpt2": {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
}


def batches():
    """``UPDATES`` global batches of ``SEQUENCES`` Zipf-like sequences (no padding)."""
    rng = np.random.default_rng(0)
    weights = 1.0 / np.arange(1, hf_tiny.V - 2)
    ids = rng.choice(
        np.arange(3, hf_tiny.V), (UPDATES, SEQUENCES, LENGTH), p=weights / weights.sum()
    )
    return torch.from_numpy(ids)


def targets():
    return [row.tolist() for batch in batches() for row in batch]


def stock_model(family: str, seed: int = 0):
    return hf_tiny.build(family, seed, **SETTINGS.get(family, {}))


def fresh_model(family: str, seed: int = 0):
    return add_natural_bias(stock_model(family, seed), targets())


def meta_model(family: str):
    with torch.device("meta"):
        return stock_model(family)


def inputs_of(model, ids):
    if hf_tiny.is_seq2seq(model):
        return {"input_ids": ids, "decoder_input_ids": ids[:, :-1]}, ids[:, 1:]
    return {"input_ids": ids}, ids


def update(model, optimizer, loss_fn, ids, world: int, data_parallel: bool) -> float:
    """One update; the global batch's loss (token sum / target tokens)."""
    inputs, labels = inputs_of(model, ids)
    tokens = SEQUENCES * (labels.shape[1] - (0 if hf_tiny.is_seq2seq(model) else 1))
    if data_parallel:  # each process its slice: the gradients are averaged over processes
        rank, share = dist.get_rank(), SEQUENCES // world
        inputs = {k: v[rank * share : (rank + 1) * share] for k, v in inputs.items()}
        labels = labels[rank * share : (rank + 1) * share]
    loss = loss_fn(model(**inputs), labels, num_items_in_batch=tokens)
    (loss * (world if data_parallel else 1)).backward()
    optimizer.step()
    optimizer.zero_grad()
    total = loss.detach().clone()
    if data_parallel:
        dist.all_reduce(total)
    return total.item()


def train(model, world: int = 1, data_parallel: bool = False) -> dict:
    """Trains ``UPDATES`` updates; b, the gain, W (whole) and the statistics after."""
    loss_fn = UnigramLabelSmoothingLoss.from_model(model, epsilon=0.1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0, foreach=False)
    model.train()
    losses = [update(model, optimizer, loss_fn, ids, world, data_parallel) for ids in batches()]
    probe = dict(zip(("inputs", "labels"), inputs_of(model, batches()[0][:2])))
    probe = {**probe.pop("inputs"), "labels": probe["labels"]}
    return {
        "losses": losses,
        "stats": statistics(model, probe),
        "callback": callback_on_every_process(model, probe),
        **output_layer(model),
    }


def output_layer(model) -> dict:
    """b, the gain and W, whole (gathered on every process where sharded)."""
    from natbias.hf.sharded import gathered

    with gathered(model):
        head = model.get_output_embeddings()
        return {
            "bias": full(model.output_bias().detach()).clone(),
            "gain": full(head.gain().detach()).clone(),
            "weight": full(head.weight.detach()).clone(),
        }


def full_state(model) -> dict:
    from natbias.hf.sharded import gathered

    with gathered(model):
        return {k: full(v.detach()).clone() for k, v in model.state_dict().items()}


# --- the engines ---------------------------------------------------------------


def mesh(world: int):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world,))


def fsdp2(model, world: int):
    from torch.distributed.fsdp import fully_shard

    for module in model.modules():
        if type(module).__name__.endswith(("DecoderLayer", "EncoderLayer")):
            fully_shard(module, mesh=mesh(world))
    fully_shard(model, mesh=mesh(world))
    return model


def dtensor_evidence(model) -> dict:
    """Which parameters are DTensors, and their local and whole sizes."""
    return {
        name: (str(tuple(p.placements)), p.to_local().numel(), p.numel())
        for name, p in model.named_parameters()
        if is_dtensor(p)
    }


def run_fsdp2(family: str, world: int) -> dict:
    model = fsdp2(fresh_model(family), world)
    initial = full_state(model)
    return {"initial": initial, "sharded": dtensor_evidence(model), **train(model, world, True)}


def run_fsdp1(family: str, world: int) -> dict:
    from torch.distributed.fsdp import FullyShardedDataParallel

    model = fresh_model(family)
    total = sum(p.numel() for p in model.parameters())
    model = FullyShardedDataParallel(model, device_id=torch.device("cpu"), use_orig_params=True)
    initial = full_state(model)
    flat = [h.flat_param for h in model._all_handles]
    evidence = {"flat": sum(p._local_shard.numel() for p in flat), "total": total}
    return {"initial": initial, "sharded": evidence, **train(model, world, True)}


def run_tp(family: str, world: int, out: Path) -> dict:
    from transformers import AutoModelForCausalLM

    path = out / f"{family}-saved"
    if dist.get_rank() == 0:
        fresh_model(family).save_pretrained(path)
    dist.barrier()
    model = AutoModelForCausalLM.from_pretrained(path, tp_plan="auto")
    initial = full_state(model)
    with torch.no_grad():
        logits = model.eval()(input_ids=batches()[0][:2]).logits
    evidence = dtensor_evidence(model)
    return {"initial": initial, "sharded": evidence, "logits": logits, **train(model, world)}


def run_meta_fsdp2(family: str, world: int) -> dict:
    """Build on meta, add the bias, shard, materialise: the order FSDP2 users follow."""
    model = fsdp2(add_natural_bias(meta_model(family), targets()), world)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.init_weights()
    initial = full_state(model)
    return {
        "initial": initial,
        "sharded": dtensor_evidence(model),
        "refusals": wrong_orders(family, world),
        **train(model, world, True),
    }


def wrong_orders(family: str, world: int) -> dict:
    """What the wrong orders say: the bias added after sharding; a forward
    after to_empty without initialisation (unsharded: an error inside an
    FSDP2 forward leaves its parameters gathered, and the run is over)."""
    sharded = fsdp2(meta_model(family), world)
    refusals = {"add_natural_bias after sharding": refusal(add_natural_bias, sharded, targets())}
    uninitialised = add_natural_bias(meta_model(family), targets()).to_empty(device="cpu")
    inputs = inputs_of(uninitialised, batches()[0])[0]
    refusals["forward before initialisation"] = refusal(uninitialised, **inputs)
    return refusals


def refusal(call, *args, **kwargs) -> str:
    try:
        call(*args, **kwargs)
    except NaturalBiasError as error:
        return str(error)
    return "not refused"


def callback_on_every_process(model, probe) -> dict:
    """BiasStatisticsCallback.on_log as the Trainer calls it on each process."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    state = TrainerState()
    state.is_world_process_zero = not dist.is_initialized() or dist.get_rank() == 0
    logs = {"loss": 1.0}
    args = TrainingArguments(output_dir="unused", report_to=[], use_cpu=True)
    BiasStatisticsCallback(probe).on_log(args, state, TrainerControl(), model=model, logs=logs)
    return logs


def main(out: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    world, rank, out = dist.get_world_size(), dist.get_rank(), Path(out)
    for case, (family, engine) in CASES.items():
        torch.manual_seed(0)
        if engine == "fsdp2":
            result = run_fsdp2(family, world)
        elif engine == "fsdp1":
            result = run_fsdp1(family, world)
        elif engine == "tp":
            result = run_tp(family, world, out)
        else:
            result = run_meta_fsdp2(family, world)
        if rank == 0:
            torch.save(result, out / f"{case}.pt")
        print(f"rank {rank}: {case} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    natbias.hf.install()
    main(sys.argv[1])
