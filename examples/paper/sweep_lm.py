"""Kobayashi et al.'s experiment (2023, sec. 3.3) for a language model. For
each output-bias scale lambda (and logit adjustment tau), given as overrides
when the model is loaded (the controls of sweep.py), continue the prompts of a
held-out split and report diversity next to quality::

    python examples/paper/sweep_lm.py lm-bin checkpoints/lm/checkpoint_best.pt \\
        --lambdas 0 0.25 0.5 0.75 1 --decoding sample --out-dir analysis/lm-sweep

Per (lambda, tau): each sentence of the split, cut after ``--prompt-tokens``
tokens, is continued (sampling, seeded, or beam search); reported are
distinct-1..4 and D of the continuations, ``ref_nll`` (teacher-forced bits
per token of the split's reference text under the controlled model, as
fairseq-eval-lm reports it) and chrF/BLEU of each continuation against the
sentence's own continuation. The checkpoint must be a transformer_lm_natbias
one. Written to --out-dir: continuations.<decoding>.lambda<l>.tau<t>.txt,
sweep_lm.tsv, sweep_lm.md, sweep_lm.png.
"""

import math
import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from decomposition import load_hub
from quality import quality
from sweep import BIAS_SCALE, LOGIT_ADJUSTMENT, Setting, add_grid_arguments, settings, write_tables

from fairseq_natbias import checkpoint_loading
from natbias.errors import NaturalBiasError
from natbias.tools import cli, distinct

LN2 = math.log(2.0)
DECODINGS = ("sample", "beam")
COLUMNS = (
    "lambda",
    "tau",
    "ref_nll",
    "chrF",
    "BLEU",
    "D1",
    "D2",
    "D3",
    "D4",
    "D",
    "sentences",
    "mean_length",
)


def load(checkpoint: str, data: str, setting: Setting):
    """The hub interface of ``checkpoint`` with the setting's overrides."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    from fairseq_natbias.transformer_lm_natbias import TransformerLanguageModelNatbias

    arch = getattr(checkpoint_loading.saved_model_args(checkpoint), "arch", None)
    if ARCH_MODEL_REGISTRY.get(arch) is not TransformerLanguageModelNatbias:
        raise NaturalBiasError(
            f"{checkpoint} was trained with --arch {arch}, not a transformer_lm_natbias "
            "language model; for a translation model use examples/paper/sweep.py"
        )
    if not os.path.isfile(os.path.join(data, "dict.txt")):
        raise NaturalBiasError(
            f"{data} has no dict.txt: give the language model's data directory "
            "(fairseq-preprocess --only-source output)"
        )
    return load_hub(
        TransformerLanguageModelNatbias,
        checkpoint,
        data,
        **{BIAS_SCALE: setting.lam, LOGIT_ADJUSTMENT: setting.tau},
    )


def split_sentences(data: str, split: str, dictionary) -> list[torch.Tensor]:
    """The sentences of the binarised ``DATA/SPLIT.{bin,idx}`` (each ending in EOS)."""
    from fairseq.data import data_utils

    dataset = data_utils.load_indexed_dataset(os.path.join(data, split), dictionary)
    if dataset is None:
        raise NaturalBiasError(f"no binarised {split} split in {data} ({split}.bin/.idx)")
    sentences = [dataset[i].long() for i in range(len(dataset))]
    if not sentences:
        raise NaturalBiasError(f"the {split} split of {data} is empty: nothing to continue")
    return sentences


def reference_nll_bits(hub, sentences: Sequence[torch.Tensor], batch_size: int = 64) -> float:
    """Teacher-forced bits per token of the sentences (EOS included), each on its
    own after an EOS as fairseq's language_modeling task reads it (right-padded
    in batches: a causal model never sees the padding)."""
    from fairseq.data import data_utils

    model = hub.models[0]
    dictionary = hub.task.source_dictionary
    eos, pad = dictionary.eos(), dictionary.pad()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(sentences), batch_size):
            batch = sentences[start : start + batch_size]
            sources = [torch.cat([s.new([eos]), s[:-1]]) for s in batch]
            source = data_utils.collate_tokens(sources, pad)
            target = data_utils.collate_tokens(batch, pad)
            lprobs = model.get_normalized_probs(model(source), log_probs=True)
            picked = lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
            mask = target.ne(pad)
            total -= picked[mask].double().sum().item()
            tokens += int(mask.sum())
    return total / tokens / LN2


def continue_prompts(
    hub,
    sentences,
    prompt_tokens: int,
    decoding: str,
    max_continuation: int,
    beam: int = 5,
    topk: int = -1,
    topp: float = -1.0,
    seed: int = 1,
    batch_size: int = 64,
):
    """``(prompt, continuation, reference)`` per sentence longer than the prompt."""
    dictionary = hub.task.source_dictionary
    post_process = (
        "sentencepiece"
        if any(
            "\u2581" in dictionary[i]
            for i in range(dictionary.nspecial, min(len(dictionary), dictionary.nspecial + 50))
        )
        else None
    )
    kept = [s for s in sentences if len(s) - 1 > prompt_tokens]
    prompts = [torch.cat([s[:prompt_tokens], s.new([dictionary.eos()])]) for s in kept]
    options = (
        {"sampling": True, "sampling_topk": topk, "sampling_topp": topp, "beam": 1}
        if decoding == "sample"
        else {"beam": beam}
    )
    torch.manual_seed(seed)
    results = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        hypotheses = hub.generate(
            batch, max_len_a=0, max_len_b=prompt_tokens + max_continuation, **options
        )
        for sentence, hypos in zip(kept[start : start + batch_size], hypotheses):
            generated = hypos[0]["tokens"]
            results.append(
                (
                    dictionary.string(sentence[:prompt_tokens], post_process),
                    dictionary.string(generated[prompt_tokens:], post_process),
                    dictionary.string(sentence[prompt_tokens:], post_process),
                )
            )
    return results


def sweep_lm(
    data: str,
    checkpoint: str,
    grid: Sequence[Setting],
    out_dir: str,
    split: str = "test",
    prompt_tokens: int = 3,
    decoding: str = "sample",
    max_continuation: int = 30,
    beam: int = 5,
    topk: int = -1,
    topp: float = -1.0,
    seed: int = 1,
    tokenize: str = "13a",
    progress=None,
) -> list[dict]:
    if decoding not in DECODINGS:
        raise NaturalBiasError(f"--decoding {decoding!r}: choose {' or '.join(DECODINGS)}")
    if prompt_tokens < 1:
        raise NaturalBiasError("--prompt-tokens must be at least 1")
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for i, setting in enumerate(grid, start=1):
        started = time.time()
        hub = load(checkpoint, data, setting)
        sentences = split_sentences(data, split, hub.task.source_dictionary)
        triples = continue_prompts(
            hub, sentences, prompt_tokens, decoding, max_continuation, beam, topk, topp, seed
        )
        path = os.path.join(out_dir, f"continuations.{decoding}.{setting.name}.txt")
        with open(path, "w", encoding="utf-8") as out:
            out.writelines("\t".join(t) + "\n" for t in triples)
        continuations = [t[1] for t in triples]
        row = {
            "lambda": setting.lam,
            "tau": setting.tau,
            "decoding": decoding,
            "ref_nll": reference_nll_bits(hub, sentences),
            "sentences": len(triples),
            "mean_length": sum(len(c.split()) for c in continuations) / len(triples),
            "output": path,
        }
        row.update(quality(continuations, [t[2] for t in triples]))
        row.update(distinct.text_diversity(continuations, tokenize))
        rows.append(row)
        if progress:
            progress(
                f"[{i}/{len(grid)}] lambda={setting.lam:g} tau={setting.tau:g} "
                f"({decoding}): ref NLL {row['ref_nll']:.3f} bits, chrF "
                f"{row['chrF']:.2f}, D {row['D']:.3f} ({time.time() - started:.0f}s)"
            )
    return rows


def write_sweep_lm(rows: list[dict], out_dir: str, name: str = "sweep_lm") -> list[str]:
    decodings = sorted({row["decoding"] for row in rows})
    notes = [
        f"Decoding: {', '.join(decodings)}. lambda: output-bias scale; tau: logit "
        "adjustment (logits g W phi + lambda b - tau log p_unigram). ref_nll: bits "
        "per reference token under the controlled model. chrF/BLEU: continuations "
        "against the references' own continuations. D_n: distinct n-grams / "
        "n-grams over all continuations; D: mean of D_1..D_4."
    ]
    metrics = [
        ("ref_nll", "reference NLL (bits/token)"),
        ("chrF", "chrF of continuations"),
        ("D", "diversity D (mean distinct-1..4)"),
    ]
    return write_tables(rows, out_dir, name, COLUMNS, notes, metrics)


PROG = "examples/paper/sweep_lm.py"


def build_parser():
    parser = cli.parser_for(PROG, __doc__)
    parser.add_argument("data", help="language-model data directory (binarised, dict.txt)")
    parser.add_argument("checkpoint", help="transformer_lm_natbias checkpoint (.pt)")
    add_grid_arguments(parser, default_lambdas=[0.0, 0.25, 0.5, 0.75, 1.0])
    parser.add_argument(
        "--split", default="test", help="split to take prompts from (default: test)"
    )
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=3,
        help="tokens of each sentence given as the prompt (default: 3)",
    )
    parser.add_argument(
        "--max-continuation",
        type=int,
        default=30,
        help="most tokens generated after the prompt (default: 30)",
    )
    parser.add_argument("--decoding", choices=DECODINGS, default="sample")
    parser.add_argument("--beam", type=int, default=5, help="beam size with --decoding beam")
    parser.add_argument(
        "--sampling-topk", type=int, default=-1, help="top-k sampling (default: off)"
    )
    parser.add_argument(
        "--sampling-topp", type=float, default=-1.0, help="top-p sampling (default: off)"
    )
    parser.add_argument("--seed", type=int, default=1, help="sampling seed (default: 1)")
    cli.add_tokenize_argument(parser, "word splitting for distinct-n")
    parser.add_argument("--out-dir", required=True, help="directory for outputs and tables")
    return parser


def run(args):
    grid = settings(args.lambdas, args.taus)
    rows = sweep_lm(
        args.data,
        args.checkpoint,
        grid,
        args.out_dir,
        split=args.split,
        prompt_tokens=args.prompt_tokens,
        decoding=args.decoding,
        max_continuation=args.max_continuation,
        beam=args.beam,
        topk=args.sampling_topk,
        topp=args.sampling_topp,
        seed=args.seed,
        tokenize=args.tokenize,
        progress=cli.progress_on_stderr(PROG),
    )
    paths = write_sweep_lm(rows, args.out_dir)
    cli.print_written(paths, Path(paths[1]).read_text(encoding="utf-8"))  # the Markdown table
    return rows


def main(argv=None):
    cli.run_tool(PROG, build_parser, run, argv)


if __name__ == "__main__":
    main()
