"""Small text helpers for the recipes (called from lib.sh, one subcommand each).

    stage        copy a raw split (plain or .gz), optionally the first N lines,
                 dropping empty / over-long / badly length-mismatched pairs
    spm-train    joint SentencePiece model on some text files
    spm-encode   text -> space-separated pieces, as fairseq-preprocess reads them
    multilingual-bin  several pairs' pieces as one data-bin with one dictionary
                 (examples/multilingual/prepare.py's binarise; runs fairseq-preprocess)
    score        hypotheses (H- lines) of fairseq-generate output in input order,
                 scored by sacreBLEU's command line (BLEU and chrF, its JSON)
    table        Markdown table of BLEU/chrF over inits (mean and standard error)
    jsonl-text   the "text" field of JSON-lines files (.gz allowed), e.g. C4 shards
    free-port    an unused TCP port on this machine

The standard library and the text-only tools of natbias.tools (SentencePiece,
fairseq-generate output, score files, mean and standard error): no torch, no fairseq.
"""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from natbias.counts import open_text
from natbias.tools.cli import parser_for


def _existing(prefix, lang):
    for name in (f"{prefix}.{lang}", f"{prefix}.{lang}.gz"):
        if Path(name).exists():
            return name
    sys.exit(f"natbias_tools.py: no {prefix}.{lang} (or .gz)")


# --- stage ----------------------------------------------------------------------


def _keep(src, tgt, max_words, ratio):
    """clean-corpus-n.perl's rule (fairseq's prepare-*.sh), on words."""
    ns, nt = len(src.split()), len(tgt.split())
    if ns == 0 or nt == 0:
        return False
    if max_words and (ns > max_words or nt > max_words):
        return False
    return not ratio or (ns / nt <= ratio and nt / ns <= ratio)


def cmd_stage(args):
    src_in = _existing(args.input, args.langs[0])
    tgt_in = _existing(args.input, args.langs[1])
    kept = read = 0
    with (
        open_text(src_in) as fs,
        open_text(tgt_in) as ft,
        open(f"{args.output}.{args.langs[0]}", "w", encoding="utf-8") as os_,
        open(f"{args.output}.{args.langs[1]}", "w", encoding="utf-8") as ot,
    ):
        for src, tgt in zip(fs, ft):
            read += 1
            src, tgt = " ".join(src.split()), " ".join(tgt.split())
            if args.clean and not _keep(src, tgt, args.max_words, args.ratio):
                continue
            os_.write(src + "\n")
            ot.write(tgt + "\n")
            kept += 1
            if args.max_lines and kept >= args.max_lines:
                break
    print(f"  {args.output}: {kept} of {read} pairs read")


# --- SentencePiece ----------------------------------------------------------------


def cmd_spm_train(args):
    """natbias.tools.sentencepiece_text's trainer; the recipes' models keep
    SentencePiece's own <s> and </s> (as they always have)."""
    from natbias.tools import sentencepiece_text

    sentencepiece_text.train(
        args.input,
        args.prefix,
        args.vocab_size,
        keep_sentencepiece_specials=True,
        threads=args.threads,
        max_sentences=args.max_sentences,
        log_level=1,
    )


def cmd_spm_encode(args):
    from natbias.tools import sentencepiece_text

    sentencepiece_text.encode_files(args.model, args.input, args.output_dir)


def cmd_multilingual_bin(args):
    """Each pair's pieces from PIECES/<corpus> (its languages sorted, as lib.sh's corpus_of)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "multilingual"))
    from prepare import binarise

    pairs = [tuple(pair.split("-")) for pair in args.pairs]
    pieces = {pair: Path(args.pieces) / "-".join(sorted(pair)) for pair in pairs}
    binarise(pieces, args.out, args.tests, args.workers)


# --- evaluation --------------------------------------------------------------------


def _hypotheses(generate_output, expect):
    """fairseq-generate prints H-<id> lines in batch order; sort them by id."""
    from natbias.tools.generate_output import parse_generate_output

    with open(generate_output, encoding="utf-8") as lines:
        sentences = parse_generate_output(lines)
    hyps = {i: s.hypothesis for i, s in sentences.items() if s.hypothesis is not None}
    if sorted(hyps) != list(range(expect)):
        sys.exit(
            f"natbias_tools.py score: {len(hyps)} hypotheses in {generate_output}, "
            f"expected ids 0..{expect - 1}"
        )
    return [hyps[i] for i in range(expect)]


def cmd_score(args):
    """<prefix>.hyp, and sacreBLEU's own JSON per metric: <prefix>.bleu.json,
    <prefix>.chrf.json (one sacrebleu run for both)."""
    with open_text(args.reference) as f:
        expect = sum(1 for _ in f)
    hyp = f"{args.prefix}.hyp"
    with open(hyp, "w", encoding="utf-8") as f:
        f.writelines(h + "\n" for h in _hypotheses(args.generate_output, expect))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sacrebleu",
            args.reference,
            "-i",
            hyp,
            "-m",
            "bleu",
            "chrf",
            "-w",
            "2",
            "-f",
            "json",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    scores = dict(zip(("bleu", "chrf"), json.loads(out)))
    for metric, result in scores.items():
        Path(f"{args.prefix}.{metric}.json").write_text(
            json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
        )
    print(f"BLEU {scores['bleu']['score']}, chrF {scores['chrf']['score']}")


def _cell(values):
    """Mean ± standard error over seeds, as the package's natbias-report computes it."""
    from natbias.tools.stats import mean_stderr

    return mean_stderr(values).format(2, count=False, missing="–")


def _seed_number(path):
    match = re.search(r"(\d+)$", path.name)
    return int(match.group(1)) if match else 0


def cmd_table(args):
    """One row per init (RUNS/<init>/seed<k>/<set>.<metric>.json), one column
    per evaluation set and metric; the signatures below the table."""
    from natbias.tools.runs import read_test_score

    runs = Path(args.runs)
    order = {name: i for i, name in enumerate(args.order)}
    inits = sorted(
        (d for d in runs.iterdir() if d.is_dir()),
        key=lambda d: (order.get(d.name, len(order)), d.name),
    )
    columns = [(s, m) for s in args.sets for m in ("bleu", "chrf")]
    signatures, rows, present = {}, [], set()
    for init in inits:
        seeds = sorted((d for d in init.glob("seed*") if d.is_dir()), key=_seed_number)
        scores = {c: [] for c in columns}
        for seed in seeds:
            for eval_set, metric in columns:
                score = read_test_score(str(seed), metric, eval_set)
                if score is not None:
                    scores[eval_set, metric].append(score.value)
                    signatures[metric] = score.signature
                    present.add(eval_set)
        done = max((len(v) for v in scores.values()), default=0)
        rows.append((init.name, done, scores))
    columns = [c for c in columns if c[0] in present] or columns[:2]
    header = ["init", "seeds"] + [f"{s} {'BLEU' if m == 'bleu' else 'chrF'}" for s, m in columns]
    lines = [
        f"## {args.title}",
        "",
        "Mean ± standard error over seeds (sacreBLEU, detokenised, beam "
        f"{args.beam}, length penalty {args.lenpen}).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
    ]
    for name, done, scores in rows:
        lines.append(
            "| " + " | ".join([name, str(done)] + [_cell(scores[c]) for c in columns]) + " |"
        )
    lines.append("")
    for metric, label in (("bleu", "BLEU"), ("chrf", "chrF")):
        if metric in signatures:
            lines.append(f"{label} signature: `{signatures[metric]}`  ")
    text = "\n".join(lines).rstrip() + "\n"
    # Job-array tasks may write it at the same time: replace it whole.
    tmp = Path(f"{args.output}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, args.output)
    print(text, end="")


# --- misc ----------------------------------------------------------------------------


def cmd_jsonl_text(args):
    with open(args.output, "w", encoding="utf-8") as out:
        for path in args.input:
            with open_text(path) as f:
                for line in f:
                    for text_line in json.loads(line)["text"].splitlines():
                        if text_line.strip():
                            out.write(text_line.strip() + "\n")


def cmd_free_port(_args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        print(s.getsockname()[1])


def main(argv=None):
    parser = parser_for("natbias_tools.py", __doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("stage")
    p.add_argument("--input", required=True, help="prefix: PREFIX.LANG or PREFIX.LANG.gz")
    p.add_argument("--output", required=True, help="prefix of the staged copy")
    p.add_argument("--langs", nargs=2, required=True)
    p.add_argument("--max-lines", type=int, default=0, help="keep the first N pairs (0: all)")
    p.add_argument("--clean", action="store_true", help="drop empty/long/mismatched pairs")
    p.add_argument("--max-words", type=int, default=0)
    p.add_argument("--ratio", type=float, default=0.0)
    p.set_defaults(func=cmd_stage)

    p = sub.add_parser("spm-train")
    p.add_argument("--input", nargs="+", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--max-sentences", type=int, default=0)
    p.add_argument("--threads", type=int, default=4)
    p.set_defaults(func=cmd_spm_train)

    p = sub.add_parser("spm-encode")
    p.add_argument("--model", required=True)
    p.add_argument("--input", nargs="+", required=True)
    p.add_argument("--output-dir", required=True, help="encoded files keep their names (less .gz)")
    p.set_defaults(func=cmd_spm_encode)

    p = sub.add_parser("multilingual-bin")
    p.add_argument("--pairs", nargs="+", required=True, help="SRC-TGT ...")
    p.add_argument("--pieces", required=True, help="folder of <l1>-<l2>/{train,valid,...}.LANG")
    p.add_argument("--tests", nargs="+", default=["test"], help="test sets: test, test1, ...")
    p.add_argument("--out", required=True, help="the data-bin to write")
    p.add_argument("--workers", type=int, default=1)
    p.set_defaults(func=cmd_multilingual_bin)

    p = sub.add_parser("score")
    p.add_argument("--generate-output", required=True)
    p.add_argument("--reference", required=True, help="raw target text, one line per source")
    p.add_argument("--prefix", required=True, help="writes PREFIX.hyp, .bleu.json, .chrf.json")
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("table")
    p.add_argument("--runs", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--title", default="Results")
    p.add_argument("--sets", nargs="+", default=["test", "ood"])
    p.add_argument("--order", nargs="*", default=["unigram", "zero", "none", "file"])
    p.add_argument("--beam", default="5")
    p.add_argument("--lenpen", default="1")
    p.set_defaults(func=cmd_table)

    p = sub.add_parser("jsonl-text")
    p.add_argument("--input", nargs="+", required=True)
    p.add_argument("--output", required=True)
    p.set_defaults(func=cmd_jsonl_text)

    p = sub.add_parser("free-port")
    p.set_defaults(func=cmd_free_port)

    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
