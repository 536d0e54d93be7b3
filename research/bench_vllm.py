"""vLLM's speed with and without the natural bias, side by side: the same
weights served by natbias's plugin (``NaturalBiasLlamaForCausalLM``: W (g phi)
+ b) and by vLLM's stock ``LlamaForCausalLM`` (W' = g W, no b: the logits
less b), the same prompts, batch and greedy decoding, in the same process.

The model is a Llama of the size given (default: 4 layers, d 512, 8 heads of
64, FFN 1,408, 8,000 entries, untied), random and built in code; b is its
log-unigram start over Zipf-like targets. Each round generates ``--tokens``
tokens for each of ``--prompts`` prompts of 16 tokens with each engine, the
engines alternating so that a change in the machine's load meets each alike
(both engines are loaded once, before the first round). Printed and
written to ``--out``: output tokens per second per engine and round, the
median and the best round (the one least slowed by other work on a shared
machine), and the ratio with b / without b per round and of the best rounds.

Run in vLLM's environment (make vllm-env):

    .venv-vllm/bin/python research/bench_vllm.py --rounds 5 --out research/results/vllm_speed.md
"""

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # both engines in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def build(directory, args):
    """The natural-bias Llama and the stock Llama of the same weights, saved."""
    import torch
    import transformers

    from natbias.hf import add_natural_bias

    config = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
        num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
        num_key_value_heads=args.hidden // 64, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    stock = transformers.LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(0)
    ranks = torch.arange(1, args.vocab + 1, dtype=torch.float64)
    targets = torch.multinomial(1 / ranks, 200_000, True, generator=generator).view(-1, 100)
    model = add_natural_bias(transformers.LlamaForCausalLM(config).eval(), targets.tolist())
    model.load_state_dict(stock.state_dict(), strict=False)  # the same W and body
    model.save_pretrained(os.path.join(directory, "natbias"))
    with torch.no_grad():  # W' = g W: the same logits less b
        stock.lm_head.weight.mul_(model.output_gain().item())
    stock.save_pretrained(os.path.join(directory, "stock"))
    return os.path.join(directory, "natbias"), os.path.join(directory, "stock")


def tokens_per_second(llm, prompts, tokens):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, detokenize=False)
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--ffn", type=int, default=1408)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out")
    args = parser.parse_args()

    import torch
    import vllm

    with tempfile.TemporaryDirectory() as directory:
        paths = dict(zip(("with b", "without b"), build(directory, args)))
        engines = {
            name: vllm.LLM(path, dtype=args.dtype, skip_tokenizer_init=True, max_model_len=256,
                           max_num_seqs=args.prompts, enforce_eager=True, seed=0)
            for name, path in paths.items()
        }  # fmt: skip
        generator = torch.Generator().manual_seed(1)
        prompts = torch.randint(3, args.vocab, (args.prompts, 16), generator=generator).tolist()
        for llm in engines.values():  # warm-up
            tokens_per_second(llm, prompts[:4], 4)
        rates = {name: [] for name in engines}
        for _ in range(args.rounds):
            for name, llm in engines.items():
                rates[name].append(tokens_per_second(llm, prompts, args.tokens))
    ratios = [a / b for a, b in zip(rates["with b"], rates["without b"])]
    lines = [
        f"vLLM {vllm.__version__} ({torch.__version__}), {os.cpu_count()} CPUs; Llama "
        f"{args.layers} layers, d {args.hidden}, vocabulary {args.vocab}, {args.dtype}; "
        f"{args.prompts} prompts x {args.tokens} greedy tokens, {args.rounds} rounds",
        "",
        "| engine | output tokens/s per round | median | best |",
        "|---|---|---|---|",
    ]
    for name, values in rates.items():
        per_round = ", ".join(f"{v:.0f}" for v in values)
        lines.append(
            f"| {name} | {per_round} | {statistics.median(values):.0f} | {max(values):.0f} |"
        )
    best = max(rates["with b"]) / max(rates["without b"])
    lines += [
        "",
        f"ratio with b / without b per round: {', '.join(f'{r:.3f}' for r in ratios)}; "
        f"median {statistics.median(ratios):.3f}; of the best rounds {best:.3f}",
    ]
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as out:
            out.write("\n".join(lines) + "\n")


if __name__ == "__main__":  # vLLM starts processes that import this module
    main()
