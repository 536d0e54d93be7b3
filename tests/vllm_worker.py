"""Runs in vLLM's environment (.venv-vllm), for tests/test_vllm.py: one
process serves each saved model with vllm.LLM in turn (the engine in this
process: VLLM_ENABLE_V1_MULTIPROCESSING=0, seconds per model), each model's
requests of every lambda in one batch, and writes what vLLM generated to a
JSON file. It compares nothing: the tests do.

    python vllm_worker.py spec.json out.json

spec: {"prompts": [[ids]], "steps": n, "scales": [lambda, ...],
       "models": [{"name", "path", "dtype", "lora"?, "tensor_parallel_size"?}], "refused": [{"name", "path"}]}
out:  {name: {"tokens": [[ids]], "logprobs": [[float]],
              "scaled": {lambda: [[ids]]}, "scaled_logprobs": {lambda: [[float]]},
              "lora"?: [[ids]]} or {"error": "..."}}
(log-probabilities after the logits processors: lambda b included)
"""

import gc
import json
import os
import sys
import traceback

# 20 sequences of at most 64 tokens need well under a MiB of cache. vLLM's CPU
# default (VLLM_CPU_KVCACHE_SPACE, whole GiB) allocates and faults in a GiB per
# engine: 18 engines spent 30 s of system time on it.
KV_CACHE = 64 << 20


def sampling(steps, scale=None):
    """Greedy, each token's log-probability; ``scale``: the request's lambda."""
    from vllm import SamplingParams

    extra = None if scale is None else {"natbias_bias_scale": scale}
    return SamplingParams(
        temperature=0.0,
        max_tokens=steps,
        ignore_eos=True,
        logprobs=1,
        detokenize=False,
        extra_args=extra,
    )


def generate(llm, prompts, runs, steps, lora=None):
    """Every run's requests in one batch, as a server batches requests:
    ``runs`` maps a name to its lambda (None: the model as saved); ``lora``:
    the adapter's folder, for every request. name -> (tokens, log-probabilities
    of the prompts in order)."""
    from vllm.lora.request import LoRARequest

    names = [name for name in runs for _ in prompts]
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts] * len(runs),
        [sampling(steps, runs[name]) for name in names],
        use_tqdm=False,
        lora_request=LoRARequest("adapter", 1, lora) if lora else None,
    )
    results = {name: ([], []) for name in runs}
    for name, output in zip(names, outputs):
        completion = output.outputs[0]
        tokens, logprobs = results[name]
        tokens.append(list(completion.token_ids))
        logprobs.append(
            [step[t].logprob for t, step in zip(completion.token_ids, completion.logprobs)]
        )
    return results


def serve(model, spec):
    from vllm import LLM

    lora = model.get("lora")
    options = dict(enable_lora=True, max_lora_rank=8, max_loras=1) if lora else {}
    parallel = model.get("tensor_parallel_size", 1)
    if parallel > 1:  # one core a process: vLLM binds by NUMA node, and this machine has one
        options["tensor_parallel_size"] = parallel
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(map(str, range(parallel)))
    runs = {"tokens": None, **{str(scale): scale for scale in spec["scales"]}}
    llm = LLM(
        model["path"],
        **options,
        dtype=model["dtype"],
        skip_tokenizer_init=True,
        max_model_len=64,
        max_num_seqs=len(spec["prompts"]) * len(runs),
        enforce_eager=True,
        seed=0,
        kv_cache_memory_bytes=KV_CACHE,
        # log p after the logits processors (lambda b among them), as sampled
        logprobs_mode="processed_logprobs",
    )
    try:
        results = generate(llm, spec["prompts"], runs, spec["steps"])
        tokens, logprobs = results.pop("tokens")
        result = {"tokens": tokens, "logprobs": logprobs}
        result["scaled"] = {name: generated for name, (generated, _) in results.items()}
        result["scaled_logprobs"] = {name: values for name, (_, values) in results.items()}
        if lora:
            # A batch of its own: vLLM 0.32's CPU build applies an adapter to
            # every request of a batch that has one (docs/deployment.md, vLLM).
            adapted = generate(llm, spec["prompts"], {"lora": None}, spec["steps"], lora)
            result["lora"] = adapted["lora"][0]
        return result
    finally:
        del llm
        os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)


def refuse(model):
    from vllm import LLM

    try:
        LLM(
            model["path"],
            skip_tokenizer_init=True,
            max_model_len=64,
            enforce_eager=True,
            kv_cache_memory_bytes=KV_CACHE,
        )
    except Exception as error:  # what vLLM raises, whatever it is: the test reads it
        return {"error": f"{type(error).__name__}: {error}"}
    return {"served": True}


def main(spec_path, out_path):
    import vllm.entrypoints.llm  # noqa: F401

    spec = json.load(open(spec_path))
    results = {}
    for model in spec["models"]:
        # vLLM collects garbage about 7 times per engine and unfreezes the
        # collector when an engine shuts down. With what is loaded so far
        # (vLLM's modules, and the model classes the last engine imported)
        # frozen again, the collections before the shutdown take milliseconds,
        # not 0.2 s each.
        gc.freeze()
        try:
            results[model["name"]] = serve(model, spec)
        except Exception:
            results[model["name"]] = {"error": traceback.format_exc()}
        print(f"== {model['name']}: done", file=sys.stderr, flush=True)
    for model in spec.get("refused", []):
        results[model["name"]] = refuse(model)
    with open(out_path, "w") as out:
        json.dump(results, out)


if __name__ == "__main__":  # vLLM starts processes that import this module
    main(*sys.argv[1:3])
