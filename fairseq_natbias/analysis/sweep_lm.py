"""Generation-time control of a language model's frequency bias (Kobayashi et
al., 2023, sec. 3.3): for each lambda (and tau), continue prompts from a
held-out split and measure diversity and quality side by side.

The controls are those of :mod:`fairseq_natbias.analysis.sweep` (logits
``g W phi + lambda b - tau log p_unigram``), given to the model as fairseq
overrides when it is loaded (``from_pretrained(..., natbias_bias_scale=...)``),
one load per setting.

What is measured, per setting:

prompts and continuations
    each sentence of ``--split`` (default ``test``), read from the binarised
    data, is cut after its first ``--prompt-tokens`` tokens (SentencePiece
    pieces for SentencePiece data); the model continues it up to EOS or
    ``--max-continuation`` tokens, by ancestral sampling (``--decoding sample``,
    optionally top-k / top-p) or beam search (``--decoding beam``). Sampling
    is seeded (``--seed``) so every setting sees the same random stream.
diversity
    distinct-1..4 and their mean D over all continuations (eqs. 5, 6 of
    Kobayashi et al.; :mod:`fairseq_natbias.analysis.distinct`).
quality, two measures
    ``ref_nll``: the bits per token the lambda-controlled model assigns to the
    split's reference text, teacher-forced (as fairseq-eval-lm would report
    it, one sentence at a time): how well the controlled distribution still
    predicts real text; lambda changes it because softmax renormalises.
    ``chrF`` / ``BLEU``: sacreBLEU of each continuation against the sentence's
    own continuation (signatures in the table): a reference-based check of the
    generated text itself. chrF is the primary one: at the level of short
    continuations BLEU's 4-gram precision is mostly zero.

Written to ``--out-dir``: ``continuations.<setting>.txt`` (prompt TAB
continuation TAB reference), ``sweep_lm.tsv``, ``sweep_lm.md``, ``sweep_lm.png``.
"""

import math
import os
import time
from typing import List, Sequence

import torch

from fairseq_natbias import checkpoint_loading
from fairseq_natbias.analysis import AnalysisError, distinct, plots
from fairseq_natbias.analysis.quality import quality
from fairseq_natbias.analysis.sweep import BIAS_SCALE, LOGIT_ADJUSTMENT, Setting

LN2 = math.log(2.0)
DECODINGS = ("sample", "beam")
COLUMNS = ("lambda", "tau", "ref_nll", "chrF", "BLEU", "D1", "D2", "D3", "D4", "D",
           "sentences", "mean_length")


def load(checkpoint: str, data: str, setting: Setting):
    """The hub interface of ``checkpoint`` with the setting's overrides."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    from fairseq_natbias.transformer_lm_natbias import TransformerLanguageModelNatbias

    arch = getattr(checkpoint_loading.saved_model_args(checkpoint), "arch", None)
    if ARCH_MODEL_REGISTRY.get(arch) is not TransformerLanguageModelNatbias:
        raise AnalysisError(
            f"{checkpoint} was trained with --arch {arch}, not a transformer_lm_natbias "
            "language model; for a translation model use natbias-sweep")
    if not os.path.isfile(os.path.join(data, "dict.txt")):
        raise AnalysisError(
            f"{data} has no dict.txt: give the language model's data directory "
            "(fairseq-preprocess --only-source output)")
    return checkpoint_loading.load_hub(TransformerLanguageModelNatbias, checkpoint, data,
                                       **{BIAS_SCALE: setting.lam, LOGIT_ADJUSTMENT: setting.tau})


def split_sentences(data: str, split: str, dictionary) -> List[torch.Tensor]:
    """The split's sentences as token tensors (each ending in EOS), read from
    the binarised ``DATA/SPLIT.{bin,idx}``."""
    from fairseq.data import data_utils

    dataset = data_utils.load_indexed_dataset(os.path.join(data, split), dictionary)
    if dataset is None:
        raise AnalysisError(f"no binarised {split} split in {data} ({split}.bin/.idx)")
    sentences = [dataset[i].long() for i in range(len(dataset))]
    if not sentences:
        raise AnalysisError(f"the {split} split of {data} is empty: nothing to continue")
    return sentences


def reference_nll_bits(hub, sentences: Sequence[torch.Tensor], batch_size: int = 64) -> float:
    """Teacher-forced bits per token of the sentences (EOS included) under the
    loaded (controlled) model, each sentence on its own (right-padded in
    batches: a causal model never sees the padding of earlier positions),
    starting from EOS as fairseq's language_modeling task does."""
    from fairseq.data import data_utils

    model = hub.models[0]
    dictionary = hub.task.source_dictionary
    eos, pad = dictionary.eos(), dictionary.pad()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(sentences), batch_size):
            batch = sentences[start:start + batch_size]
            sources = [torch.cat([s.new([eos]), s[:-1]]) for s in batch]
            source = data_utils.collate_tokens(sources, pad)
            target = data_utils.collate_tokens(batch, pad)
            lprobs = model.get_normalized_probs(model(source), log_probs=True)
            picked = lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
            mask = target.ne(pad)
            total -= picked[mask].double().sum().item()
            tokens += int(mask.sum())
    return total / tokens / LN2


def continue_prompts(hub, sentences, prompt_tokens: int, decoding: str, max_continuation: int,
                     beam: int = 5, topk: int = -1, topp: float = -1.0, seed: int = 1,
                     batch_size: int = 64):
    """``(prompt, continuation, reference)`` strings per sentence longer than
    the prompt."""
    dictionary = hub.task.source_dictionary
    post_process = "sentencepiece" if any("\u2581" in dictionary[i] for i in range(
        dictionary.nspecial, min(len(dictionary), dictionary.nspecial + 50))) else None
    kept = [s for s in sentences if len(s) - 1 > prompt_tokens]
    prompts = [torch.cat([s[:prompt_tokens], s.new([dictionary.eos()])]) for s in kept]
    options = ({"sampling": True, "sampling_topk": topk, "sampling_topp": topp, "beam": 1}
               if decoding == "sample" else {"beam": beam})
    torch.manual_seed(seed)
    results = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        hypotheses = hub.generate(batch, max_len_a=0, max_len_b=prompt_tokens + max_continuation,
                                  **options)
        for sentence, hypos in zip(kept[start:start + batch_size], hypotheses):
            generated = hypos[0]["tokens"]
            results.append((
                dictionary.string(sentence[:prompt_tokens], post_process),
                dictionary.string(generated[prompt_tokens:], post_process),
                dictionary.string(sentence[prompt_tokens:], post_process),
            ))
    return results


def sweep_lm(data: str, checkpoint: str, grid: Sequence[Setting], out_dir: str,
             split: str = "test", prompt_tokens: int = 3, decoding: str = "sample",
             max_continuation: int = 30, beam: int = 5, topk: int = -1, topp: float = -1.0,
             seed: int = 1, tokenize: str = "13a", progress=None) -> List[dict]:
    if decoding not in DECODINGS:
        raise AnalysisError(f"--decoding {decoding!r}: choose {' or '.join(DECODINGS)}")
    if prompt_tokens < 1:
        raise AnalysisError("--prompt-tokens must be at least 1")
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for i, setting in enumerate(grid, start=1):
        started = time.time()
        hub = load(checkpoint, data, setting)
        sentences = split_sentences(data, split, hub.task.source_dictionary)
        triples = continue_prompts(hub, sentences, prompt_tokens, decoding, max_continuation,
                                   beam, topk, topp, seed)
        path = os.path.join(out_dir, f"continuations.{decoding}.{setting.name}.txt")
        with open(path, "w", encoding="utf-8") as out:
            out.writelines("\t".join(t) + "\n" for t in triples)
        continuations = [t[1] for t in triples]
        row = {"lambda": setting.lam, "tau": setting.tau, "decoding": decoding,
               "ref_nll": reference_nll_bits(hub, sentences), "sentences": len(triples),
               "mean_length": sum(len(c.split()) for c in continuations) / len(triples),
               "output": path}
        row.update(quality(continuations, [t[2] for t in triples]))
        row.update(distinct.text_diversity(continuations, tokenize))
        rows.append(row)
        if progress:
            progress(f"[{i}/{len(grid)}] lambda={setting.lam:g} tau={setting.tau:g} "
                     f"({decoding}): ref NLL {row['ref_nll']:.3f} bits, chrF "
                     f"{row['chrF']:.2f}, D {row['D']:.3f} ({time.time() - started:.0f}s)")
    return rows


def _cell(column, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if column in ("lambda", "tau") or not isinstance(value, float):
        return f"{value:g}"
    return f"{value:.4f}" if column.startswith("D") else f"{value:.3f}" \
        if column == "ref_nll" else f"{value:.2f}"


def table_markdown(rows: List[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cell(c, row.get(c)) for c in COLUMNS) + " |" for row in rows]
    decodings = sorted({row["decoding"] for row in rows})
    lines += ["", f"Decoding: {', '.join(decodings)}. lambda: output-bias scale; tau: logit "
              "adjustment (logits g W phi + lambda b - tau log p_unigram). ref_nll: bits "
              "per reference token under the controlled model. chrF/BLEU: continuations "
              "against the references' own continuations. D_n: distinct n-grams / "
              "n-grams over all continuations; D: mean of D_1..D_4."]
    for key, name in (("bleu_signature", "BLEU"), ("chrf_signature", "chrF")):
        lines += [f"\nsacreBLEU {name} signature: `{s}`"
                  for s in sorted({row[key] for row in rows if key in row})]
    return "\n".join(lines) + "\n"


def write_sweep_lm(rows: List[dict], out_dir: str, name: str = "sweep_lm") -> List[str]:
    tsv = "\n".join(["\t".join(COLUMNS)] + ["\t".join(_cell(c, r.get(c)) for c in COLUMNS)
                                            for r in rows]) + "\n"
    paths = []
    for filename, text in ((f"{name}.tsv", tsv), (f"{name}.md", table_markdown(rows))):
        path = os.path.join(out_dir, filename)
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
        paths.append(path)
    x_key, line_key = (("lambda", "tau") if len({r["lambda"] for r in rows})
                       >= len({r["tau"] for r in rows}) else ("tau", "lambda"))
    metrics = [("ref_nll", "reference NLL (bits/token)"), ("chrF", "chrF of continuations"),
               ("D", "diversity D (mean distinct-1..4)")]
    paths.append(plots.sweep_panels(rows, x_key, line_key, metrics,
                                    os.path.join(out_dir, f"{name}.png")))
    return paths
