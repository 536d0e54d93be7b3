"""Translation speed side by side: CTranslate2 (natbias-ct2-converter, float32
and int8) against fairseq-generate, the same natural-bias model, test set,
beam and batch size, on the same CPU threads.

The model has the shape of ``transformer_natbias_iwslt_de_en`` (6+6 layers,
d 256, FFN 256, 4 heads, all embeddings tied), briefly trained on Multi30k
De->En (joint SentencePiece, 8,000 pieces) so that its translations end
where sentences do; it is trained once into ``--work`` and reused. Each
round times fairseq-generate (a process of its own; its own figure, which
counts generation and not start-up or loading) and CTranslate2's
``translate_batch`` (the model loaded beforehand) on all of test_2016_flickr,
the engines alternating so that a change in the machine's load meets each
alike. Printed, and written to ``--out``: sentences per second, median and
range over the rounds, the ratio to fairseq per round, and whether the
engines translate alike (same hypothesis, BLEU).

    .venv/bin/python research/bench_ct2.py --rounds 3 --out research/results/ct2_speed.md
"""

import argparse
import gzip
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from natbias.ct2_converter import convert  # noqa: E402
from natbias.tools import sentencepiece_text  # noqa: E402
from natbias.tools.generate_output import parse_generate_output  # noqa: E402

BIN = Path(sys.executable).parent
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
TRAINING = [
    "--arch", "transformer_natbias_iwslt_de_en", "--share-all-embeddings",
    "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "1.5e-3",
    "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100", "--dropout", "0.1",
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
    "--max-tokens", "2048", "--disable-validation", "--save-interval", "1000",
    "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "50",
    "--seed", "1", "--cpu", "--num-workers", "0",
]  # fmt: skip


def run(command, threads, **kwargs):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return subprocess.run(
        [str(c) for c in command], env=env, capture_output=True, text=True, check=True, **kwargs
    )


def prepare_data(multi30k: Path, work: Path, threads: int) -> Path:
    """Multi30k De-En as SentencePiece pieces (8,000, joint) and binarised."""
    data = work / "data-bin"
    if (data / "test.de-en.en.bin").exists():
        return data
    raw, pieces = work / "raw", work / "pieces"
    raw.mkdir(parents=True, exist_ok=True)
    for ours, theirs in SPLITS.items():
        for lang in ("de", "en"):
            with gzip.open(multi30k / f"{theirs}.{lang}.gz", "rt", encoding="utf-8") as f:
                (raw / f"{ours}.{lang}").write_text(f.read(), encoding="utf-8")
    model = work / "spm"
    sentencepiece_text.train([raw / "train.de", raw / "train.en"], model, 8000, threads=threads)
    sentencepiece_text.encode_files(f"{model}.model", sorted(raw.iterdir()), pieces)
    run(
        [BIN / "fairseq-preprocess", "--source-lang", "de", "--target-lang", "en",
         "--trainpref", pieces / "train", "--validpref", pieces / "valid",
         "--testpref", pieces / "test", "--destdir", data, "--joined-dictionary",
         "--workers", threads],
        threads,
    )  # fmt: skip
    return data


def train(data: Path, work: Path, updates: int, threads: int) -> Path:
    """Trained to ``updates`` (fairseq resumes a checkpoint with fewer, and
    stops at once on one with as many)."""
    checkpoint = work / "model" / "checkpoint_last.pt"
    started = time.perf_counter()
    run(
        [BIN / "fairseq-train", data, "--user-dir", "fairseq_natbias", *TRAINING,
         "--max-update", updates, "--save-dir", checkpoint.parent],
        threads,
        cwd=REPO,
    )  # fmt: skip
    print(f"trained to update {updates} ({time.perf_counter() - started:.0f} s)")
    return checkpoint


def fairseq_generate(data, checkpoint, args):
    """(sentences/s by fairseq-generate's own clock, hypotheses by id)."""
    out = run(
        [BIN / "fairseq-generate", data, "--user-dir", "fairseq_natbias", "--path", checkpoint,
         "--beam", args.beam, "--batch-size", args.batch_size,
         "--required-batch-size-multiple", "1", "--cpu", "--num-workers", "0"],
        args.threads,
        cwd=REPO,
    )  # fmt: skip
    rate = re.search(
        r"Translated [\d,]+ sentences .*?\(([\d.]+) sentences/s", out.stdout + out.stderr
    )
    sentences = parse_generate_output(out.stdout.splitlines())
    return float(rate[1]), [sentences[i].hypothesis.split() for i in sorted(sentences)]


def ctranslate2_translate(translator, sources, args):
    started = time.perf_counter()
    results = translator.translate_batch(
        sources, beam_size=args.beam, max_batch_size=args.batch_size, max_decoding_length=200
    )
    elapsed = time.perf_counter() - started
    return len(sources) / elapsed, [r.hypotheses[0] for r in results]


def bleu(hypotheses, references):
    import sacrebleu

    text = ["".join(h).replace("\u2581", " ").strip() for h in hypotheses]
    return sacrebleu.corpus_bleu(text, [references]).score


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--multi30k", type=Path, default=REPO.parent / "shared/data/multi30k")
    parser.add_argument("--work", type=Path, default=REPO / "work/bench_ct2")
    parser.add_argument("--updates", type=int, default=300, help="training updates")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", type=Path, help="write the results here (Markdown)")
    args = parser.parse_args()
    import ctranslate2

    data = prepare_data(args.multi30k, args.work, args.threads)
    checkpoint = train(data, args.work, args.updates, args.threads)
    translators = {}
    for quantization in ("float32", "int8"):
        directory = args.work / f"ct2-{quantization}"
        convert(checkpoint, directory, data, quantization=quantization, force=True)
        translators[quantization] = ctranslate2.Translator(
            str(directory), device="cpu", inter_threads=1, intra_threads=args.threads
        )
    sources = [line.split() for line in (args.work / "pieces/test.de").read_text().splitlines()]
    references = (args.work / "raw/test.en").read_text(encoding="utf-8").splitlines()
    rates = {name: [] for name in ("fairseq", "float32", "int8")}
    outputs, load = {}, [os.getloadavg()[0]]
    for round_ in range(args.rounds):
        rates["fairseq"].append((result := fairseq_generate(data, checkpoint, args))[0])
        outputs["fairseq"] = result[1]
        for quantization, translator in translators.items():
            rate, outputs[quantization] = ctranslate2_translate(translator, sources, args)
            rates[quantization].append(rate)
        print(f"round {round_ + 1}: " + ", ".join(f"{n} {r[-1]:.1f}" for n, r in rates.items()))
        load.append(os.getloadavg()[0])
    report = header(args, checkpoint, load) + table(rates, outputs, references, args, len(sources))
    print(report)
    if args.out:
        args.out.write_text(report, encoding="utf-8")


def header(args, checkpoint, load):
    """The command, the versions and the machine's load (1-minute averages)."""
    import platform

    import ctranslate2
    import fairseq
    import torch

    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    updates = state["optimizer_history"][-1]["num_updates"]
    cpu = platform.processor() or platform.machine()
    return "\n".join(
        [
            "# Translation speed: CTranslate2 against fairseq-generate",
            "",
            f"Command: `python research/bench_ct2.py {' '.join(sys.argv[1:])}`",
            "",
            f"Model: transformer_natbias_iwslt_de_en (6+6 layers, d 256), {updates} updates on "
            "Multi30k De-En (SentencePiece 8,000, joint, tied). CTranslate2 "
            f"{ctranslate2.__version__}, fairseq {fairseq.__version__}, torch {torch.__version__}, "
            f"{cpu}, {os.cpu_count()} cores. Machine load (1-minute average) at the start and "
            f"after each round: {', '.join(f'{x:.1f}' for x in load)}.",
            "",
            "",
        ]
    )


def table(rates, outputs, references, args, sentences):
    ours = outputs["fairseq"]
    lengths = statistics.mean(len(h) for h in ours)
    lines = [
        f"{sentences} sentences (test_2016_flickr), beam {args.beam}, batch {args.batch_size}, "
        f"{args.threads} threads, {args.rounds} rounds; mean fairseq hypothesis "
        f"{lengths:.1f} pieces",
        "",
        "| engine | sentences/s, median (range) | ratio to fairseq, median (range) "
        "| same hypothesis as fairseq | BLEU |",
        "|---|---|---|---|---|",
    ]
    for name, values in rates.items():
        ratios = [v / f for v, f in zip(values, rates["fairseq"])]
        same = sum(a == b for a, b in zip(outputs[name], ours)) / sentences
        lines.append(
            f"| {'fairseq-generate' if name == 'fairseq' else 'CTranslate2 ' + name} "
            f"| {statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f}) "
            f"| {statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f}) "
            f"| {100 * same:.1f}% | {bleu(outputs[name], references):.2f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
