"""Issue 93, item 4 at update 0: bits per validation token of a freshly built
multilingual model (``--task translation_multi_simple_epoch``) for stock
fairseq, the pooled prior and the per-language prior, per target language,
against that language's own unigram and the pooled one.

Multi30k (German, French, English), one joint SentencePiece model
(``--vocab-size``, default 4,000), one-to-many (en -> de, fr) and many-to-one
(de, fr -> en), ``--encoder-langtok src --decoder-langtok``. The language
token is the first target of every sentence (fairseq-generate forces it); it
is scored apart (``langtok``), so that ``bits`` is over the words and EOS,
where the target language's unigram is the reference:

    unigram_own     cross-entropy of the validation targets under the language's
                    own training unigram (add-one), counted here from the text
    unigram_pooled  ... under the pooled unigram of all target sides

Each natural-bias arm is measured as the task concatenates the pairs and
under temperature sampling (``--sampling``; T = 5): the pairs are of equal
size, so the two must give the same prior (natbias 2.2.0's did not: issue 102).

    python research/multilingual_step0.py --seeds 1 2 3 --out research/results/multilingual_step0.md
"""

import argparse
import itertools
import json
import math
import os
import sys
from collections import Counter
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples/multilingual"))
from prepare import prepare  # noqa: E402

# The study's set-ups, arms, task options and model builder (here at d 256).
from study_multilingual import ARMS, SETUPS, model_arguments, task_arguments  # noqa: E402

from fairseq_natbias.in_process import build_from_training_args  # noqa: E402

MODEL = model_arguments(256)


SAMPLING = {
    "concat": [],
    "temperature-5": ["--sampling-method", "temperature", "--sampling-temperature", "5"],
}


def text_unigram(paths, dictionary):
    """Add-one log unigram of pieces files (words + one EOS a line), counted here."""
    counts = Counter()
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            counts.update(dictionary.index(w) for w in line.split())
            counts[dictionary.eos()] += 1
    total = sum(counts.values()) + len(dictionary)
    return torch.tensor([math.log((counts[i] + 1) / total) for i in range(len(dictionary))])


def measure(data, pairs, arm, seed, sampling="concat"):
    """Bits per target token by target language: the model's, and the references'."""
    argv = [str(data), *task_arguments(pairs), "--cpu", "--num-workers", "0", *SAMPLING[sampling]]
    argv += [*ARMS[arm], *MODEL, "--seed", str(seed)]
    argv += ["--user-dir", str(REPO / "fairseq_natbias"), "--save-dir", os.devnull]
    _, task, model = build_from_training_args(argv)
    dictionary = task.target_dictionary
    targets = sorted({p.split("-")[1] for p in pairs})
    langtok = {task.data_manager.get_decoder_langtok(t, "tgt"): t for t in targets}
    own = {t: text_unigram([data / f"pieces/train.{t}"], dictionary) for t in targets}
    pooled = text_unigram([data / f"pieces/train.{p.split('-')[1]}" for p in pairs], dictionary)
    task.load_dataset("valid", combine=False, epoch=1)
    batches = task.get_batch_iterator(task.dataset("valid"), max_tokens=4000)
    sums = {t: Counter() for t in targets}
    model.eval()
    with torch.no_grad():
        for sample in batches.next_epoch_itr(shuffle=False):
            log_p = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
            target = sample["target"]
            nll = -log_p.gather(-1, target.unsqueeze(-1)).squeeze(-1)
            for i, first in enumerate(target[:, 0].tolist()):
                lang, words = langtok[first], target[i, 1:][target[i, 1:] != dictionary.pad()]
                row = sums[lang]
                row["langtok"] += nll[i, 0].item()
                row["bits"] += nll[i, 1 : 1 + len(words)].sum().item()
                row["unigram_own"] -= own[lang][words].sum().item()
                row["unigram_pooled"] -= pooled[words].sum().item()
                row["tokens"] += len(words)
                row["sentences"] += 1
    return {
        lang: {
            "bits": row["bits"] / row["tokens"] / math.log(2),
            "langtok": row["langtok"] / row["sentences"] / math.log(2),
            "unigram_own": row["unigram_own"] / row["tokens"] / math.log(2),
            "unigram_pooled": row["unigram_pooled"] / row["tokens"] / math.log(2),
            "tokens": row["tokens"],
        }
        for lang, row in sums.items()
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=REPO / "work/multilingual")
    parser.add_argument("--raw", type=Path, default=os.environ.get("NATBIAS_MULTI30K"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--vocab-size", type=int, default=4000)
    parser.add_argument(
        "--sampling",
        nargs="+",
        choices=SAMPLING,
        default=list(SAMPLING),
        help="how the task draws the pairs (stock is measured once, concatenated)",
    )
    parser.add_argument("--out", type=Path, help="markdown results file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    pairs = sorted({p for ps in SETUPS.values() for p in ps})
    data = prepare(args.raw, args.work / "data-full", [p.split("-") for p in pairs],
                   vocab_size=args.vocab_size)  # fmt: skip
    rows = []
    for setup, setup_pairs in SETUPS.items():
        for arm, sampling in itertools.product(ARMS, args.sampling):
            if arm == "stock" and sampling != "concat":  # no prior: sampling cannot change it
                continue
            for seed in args.seeds:
                for lang, r in measure(data, setup_pairs, arm, seed, sampling).items():
                    row = {"setup": setup, "arm": arm, "sampling": sampling, "seed": seed}
                    rows.append({**row, "lang": lang, **r})
                    print(json.dumps(rows[-1]), flush=True)
    if args.out:
        write_table(rows, args)


def write_table(rows, args):
    lines = [
        "# Multilingual models at update 0: bits per validation token",
        "",
        f"`python research/multilingual_step0.py --seeds {' '.join(map(str, args.seeds))}"
        f" --vocab-size {args.vocab_size} --out {args.out}`: the 2-core CPU development machine "
        "(shared with other work; no timing is read). Multi30k, all 29,000 pairs "
        "per direction, joint SentencePiece; 2+2 layers, d 256, tied; "
        "`--encoder-langtok src --decoder-langtok`. `bits`: the words and EOS of each target "
        "language's validation sentences (1,014 a direction), mean over seeds (min–max); "
        "`langtok`: the language token each sentence starts with (forced by fairseq-generate), "
        "bits a sentence. References: the language's own training unigram and the pooled one. "
        "`sampling`: as the task concatenates the pairs, or `--sampling-method temperature "
        "--sampling-temperature 5`.",
        "",
        "| setup | target | arm | sampling | bits | − own unigram | langtok | own unigram "
        "| pooled unigram |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    key = lambda r: (r["setup"], r["lang"], r["arm"], r["sampling"])  # noqa: E731
    for setup, lang, arm, sampling in sorted(dict.fromkeys(map(key, rows)), key=lambda k: k[:2]):
        group = [r for r in rows if key(r) == (setup, lang, arm, sampling)]
        bits = [r["bits"] for r in group]
        mean = sum(bits) / len(bits)
        lt = sum(r["langtok"] for r in group) / len(group)
        lines.append(
            f"| {setup} | {lang} | {arm} | {sampling} | {mean:.3f} ({min(bits):.3f}–{max(bits):.3f}) | "
            f"{mean - group[0]['unigram_own']:+.3f} | {lt:.2f} | {group[0]['unigram_own']:.3f} | "
            f"{group[0]['unigram_pooled']:.3f} |"
        )
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
