"""Natural-bias models trained sharded, as their users shard them: FSDP2
(``fully_shard``), FSDP1 (``FullyShardedDataParallel``, ``use_orig_params``,
with and without an auto-wrap policy), transformers' tensor parallelism (``tp_plan="auto"``), and a model built on
the meta device, given the natural bias there, sharded, then materialised.
Run by torchrun (2 processes, gloo, CPU) for tests/test_hf_sharding.py, which
trains the same models in one process (:func:`train` with ``world=1``) and
compares. Each run writes, from rank 0, ``DIR/<case>.pt``: the loss of every
update, b, the gain and W after the last, the bias statistics (computed
directly, and logged by a real Trainer's callbacks, which it hands the model
it was given, not FSDP1's wrapper), and what shows that the parameters
really were sharded.

    python -m torch.distributed.run --nproc_per_node 2 tests/hf_shard_worker.py DIR [CASE ...]

Every process takes a slice of the same global batch (tensor parallelism: the
whole batch on each), and the loss is the token sum over the global batch's
target tokens, as the Trainer computes it: the same update whatever the split.
"""

import importlib.util
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
    "fsdp1-wrap-gpt2": ("gpt2", "fsdp1-wrap"),
    "tp-llama": ("llama", "tp"),
    "meta-fsdp2-llama": ("llama", "meta-fsdp2"),
}
# DeepSpeed ZeRO-3 where DeepSpeed is installed (not by make install: docs/scaling.md),
# the last case run.
DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
if DEEPSPEED:
    CASES["zero3-gpt2"] = ("gpt2", "zero3")
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


def update(model, step, loss_fn, ids, world: int, data_parallel: bool) -> float:
    """One update (``step``: backward and the optimiser's step); the global
    batch's loss (token sum / target tokens)."""
    inputs, labels = inputs_of(model, ids)
    tokens = SEQUENCES * (labels.shape[1] - (0 if hf_tiny.is_seq2seq(model) else 1))
    if data_parallel:  # each process its slice: the gradients are averaged over processes
        rank, share = dist.get_rank(), SEQUENCES // world
        inputs = {k: v[rank * share : (rank + 1) * share] for k, v in inputs.items()}
        labels = labels[rank * share : (rank + 1) * share]
    loss = loss_fn(model(**inputs), labels, num_items_in_batch=tokens)
    step(loss * (world if data_parallel else 1))
    total = loss.detach().clone()
    if data_parallel:
        dist.all_reduce(total)
    return total.item()


def train(model, world: int = 1, data_parallel: bool = False, out: Path = None, engine=None):
    """Trains ``UPDATES`` updates; b, the gain, W (whole) and the statistics
    after; with ``out`` (sharded runs), those a Trainer logs too. ``engine``:
    DeepSpeed's around ``model``, which runs it and steps its optimiser."""
    loss_fn = UnigramLabelSmoothingLoss.from_model(model, epsilon=0.1)
    if engine is None:
        optimizer = adamw(model)

        def step(loss):
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    else:

        def step(loss):
            engine.backward(loss)
            engine.step()

    model.train()
    run = model if engine is None else engine
    losses = [update(run, step, loss_fn, ids, world, data_parallel) for ids in batches()]
    probe = dict(zip(("inputs", "labels"), inputs_of(model, batches()[0][:2])))
    probe = {**probe.pop("inputs"), "labels": probe["labels"]}
    result = {
        "losses": losses,
        "stats": statistics(model, probe, digits=None),
        **output_layer(model),
    }
    if out is not None:
        result["trainer"] = callbacks_through_a_trainer(run, probe, out)
    return result


def adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0, foreach=False)


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


def run_fsdp2(family: str, world: int, out: Path) -> dict:
    model = fsdp2(fresh_model(family), world)
    initial = full_state(model)
    evidence = dtensor_evidence(model)
    return {"initial": initial, "sharded": evidence, **train(model, world, True, out)}


def run_fsdp1(family: str, world: int, out: Path, wrap: bool = False) -> dict:
    """FSDP1 around the whole model; with ``wrap``, each block wrapped too
    (an auto-wrap policy): the root then holds the head and the embeddings."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    model = fresh_model(family)
    total = sum(p.numel() for p in model.parameters())
    blocks = {type(m) for m in model.modules() if type(m).__name__.endswith("Block")}
    policy = {"auto_wrap_policy": ModuleWrapPolicy(blocks)} if wrap else {}
    model = FullyShardedDataParallel(
        model, device_id=torch.device("cpu"), use_orig_params=True, **policy
    )
    initial = full_state(model)
    flat = [h.flat_param for h in model._all_handles]
    evidence = {
        "flat": sum(p._local_shard.numel() for p in flat),
        "total": total,
        "wrappers": sum(isinstance(m, FullyShardedDataParallel) for m in model.modules()),
    }
    return {"initial": initial, "sharded": evidence, **train(model, world, True, out)}


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
    result = train(model, world, out=out)
    return {"initial": initial, "sharded": evidence, "logits": logits, **result}


def run_meta_fsdp2(family: str, world: int, out: Path) -> dict:
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
        **train(model, world, True, out),
    }


def run_zero3(family: str, world: int, out: Path) -> dict:
    """DeepSpeed ZeRO-3 on its CPU accelerator (gloo): each parameter
    partitioned over the processes, the optimiser's state too."""
    import deepspeed

    model = fresh_model(family)
    initial = {name: value.detach().clone() for name, value in model.state_dict().items()}
    config = {
        "train_micro_batch_size_per_gpu": SEQUENCES // world,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 3},
        "zero_allow_untested_optimizer": True,  # torch's AdamW, as the other cases
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=adamw(model), config=config)
    evidence = {name: (p.ds_tensor.numel(), p.ds_numel) for name, p in model.named_parameters()}
    return {"initial": initial, "sharded": evidence, **train(model, world, True, out, engine)}


def wrong_orders(family: str, world: int) -> dict:
    """What the wrong orders say: the bias added after sharding; a forward
    after to_empty without initialisation (unsharded: an error inside an
    FSDP2 forward leaves its parameters gathered, and the run is over)."""
    sharded = fsdp2(meta_model(family), world)
    refusals = {"add_natural_bias after sharding": refusal_of(add_natural_bias, sharded, targets())}
    uninitialised = add_natural_bias(meta_model(family), targets()).to_empty(device="cpu")
    inputs = inputs_of(uninitialised, batches()[0])[0]
    refusals["forward before initialisation"] = refusal_of(uninitialised, **inputs)
    return refusals


def refusal_of(call, *args, **kwargs) -> str:
    try:
        call(*args, **kwargs)
    except NaturalBiasError as error:
        return str(error)
    return "not refused"


def callbacks_through_a_trainer(wrapped, probe, out: Path) -> dict:
    """The bias statistics as a real Trainer logs them on each process
    (Trainer.log): its callbacks get the model it was given (FSDP1's: the
    model inside the wrapper), while trainer.model_wrapped is the wrapper,
    as Trainer.train leaves them once it has wrapped the model. One
    BiasStatisticsCallback is given in ``callbacks=``, one added with
    log_bias_statistics; under FSDP1 the first is refused as training begins
    (it cannot find the wrapper), and taken out. Tensor parallelism, which
    accelerate refuses on the CPU (the Trainer's ParallelismConfig wants a
    GPU), goes through a CallbackHandler built as Trainer.__init__ builds it."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from transformers import Trainer, TrainingArguments

    fsdp1 = isinstance(wrapped, FullyShardedDataParallel)
    model = wrapped.module if fsdp1 or hasattr(wrapped, "backward") else wrapped  # DeepSpeed's
    args = TrainingArguments(
        output_dir=str(out / "trainer"), report_to=[], use_cpu=True, ddp_backend="gloo"
    )
    given = BiasStatisticsCallback(probe)
    if (getattr(model, "tp_size", None) or 1) > 1:
        return callbacks_as_the_trainer_builds_them(model, given, args)
    trainer = Trainer(model=model, args=args, callbacks=[given])
    trainer.model_wrapped = wrapped  # as Trainer.train sets them
    trainer.model = wrapped if fsdp1 else model
    assert trainer.callback_handler.model is model
    refusal = refusal_of(
        trainer.callback_handler.on_train_begin, args, trainer.state, trainer.control
    )
    if refusal != "not refused":
        trainer.remove_callback(given)
    natbias.hf.log_bias_statistics(trainer, probe)
    trainer.log({"loss": 1.0})
    return {"logged": trainer.state.log_history[-1], "refusal": refusal}


def callbacks_as_the_trainer_builds_them(model, given, args) -> dict:
    """Trainer.__init__'s CallbackHandler (transformers 5.25), called as
    Trainer.train and Trainer.log call it."""
    from transformers import TrainerControl, TrainerState
    from transformers.integrations import get_reporting_integration_callbacks
    from transformers.trainer import DEFAULT_CALLBACKS
    from transformers.trainer_callback import CallbackHandler

    callbacks = DEFAULT_CALLBACKS + get_reporting_integration_callbacks(args.report_to)
    handler = CallbackHandler(callbacks + [given], model, None, None, None)
    state = TrainerState(
        is_local_process_zero=args.local_process_index == 0,
        is_world_process_zero=args.process_index == 0,
    )
    control = TrainerControl()
    refusal = refusal_of(handler.on_train_begin, args, state, control)
    logs = {"loss": 1.0}
    state.log_history.append({**logs, "step": state.global_step})
    handler.on_log(args, state, control, logs)
    return {"logged": state.log_history[-1], "refusal": refusal}


def main(out: str, only: list) -> None:
    """Runs the cases named in ``only`` (every case if none)."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    world, rank, out = dist.get_world_size(), dist.get_rank(), Path(out)
    for case, (family, engine) in CASES.items():
        if only and case not in only:
            continue
        torch.manual_seed(0)
        if engine == "fsdp2":
            result = run_fsdp2(family, world, out)
        elif engine.startswith("fsdp1"):
            result = run_fsdp1(family, world, out, wrap=engine == "fsdp1-wrap")
        elif engine == "tp":
            result = run_tp(family, world, out)
        elif engine == "zero3":
            result = run_zero3(family, world, out)
        else:
            result = run_meta_fsdp2(family, world, out)
        if rank == 0:
            torch.save(result, out / f"{case}.pt")
        print(f"rank {rank}: {case} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed on the CPU, as the other cases
    natbias.hf.install()
    main(sys.argv[1], sys.argv[2:])
