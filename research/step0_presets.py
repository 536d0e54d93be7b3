"""Step 0 of every preset the package registers, behind docs/results.md's
"every registered preset, tied or untied, starts within 0.04 bits of the
unigram" (research/results/step0_presets.md): a freshly built model with the
package's default natural-bias settings should predict the unigram, so its
validation NLL before any update should be the unigram's own cross-entropy on
the same tokens (issue 19, item 3: within 0.3 bits).

The presets are read from fairseq's registry (every name starting with
``transformer_natbias`` or ``transformer_lm_natbias``), so a preset added later
is measured without editing this script. Each is built as fairseq-train would
build it (seed 1, CPU) on Multi30k as the study prepares it: translation
presets on De-En (joint SentencePiece 8k), untied and tied
(``--share-all-embeddings``); language-model presets on English (SentencePiece
8k, 64-token blocks), untied, and tied unless the preset ties by itself.
Measured with natbias-step0's function (``validation_divergence``): the NLL at
update 0, the unigram's cross-entropy and KL(model || unigram), in bits per
target token, and the parameters. Rows are cached in
WORKDIR/step0_presets.json, so a second run measures only what is missing.

    .venv/bin/python research/step0_presets.py --workdir /tmp/step0_presets
"""

import argparse
import json
import logging
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples" / "paper"))  # make demo's pipeline

import pipeline  # noqa: E402
from multi30k import has_all_files  # noqa: E402

import fairseq_natbias  # noqa: E402,F401  (registers the presets with fairseq)
from fairseq_natbias import in_process  # noqa: E402
from fairseq_natbias.in_process import validation_divergence  # noqa: E402

PREFIXES = ("transformer_natbias", "transformer_lm_natbias")
WITHIN_BITS = 0.3  # issue 19's tolerance (and test_natural_bias.py's)
MACHINE = "2-core CPU development machine"
CACHE_NAME = "step0_presets.json"
REQUESTS = ("untied", "tied")


@dataclass(frozen=True)
class Task:
    """How presets of one kind are built on Multi30k."""

    name: str
    langs: tuple  # the raw Multi30k languages the data needs
    folder: str  # under --workdir (and --prepared), as the study names it
    options: tuple  # fairseq-train options besides the data and the arch
    tie: tuple  # the sharing option of the tied row
    needed: tuple  # files of a complete data-bin

    def prepare(self, raw, work):
        if self.name == "translation":
            return pipeline.prepare(raw, work, vocab_size=8000, langs=self.langs)
        return pipeline.prepare_lm(raw, work, vocab_size=8000, lang=self.langs[0])


TASKS = {
    # No --source-lang/--target-lang: fairseq infers the one pair in the
    # data-bin, so the same options serve Multi30k and the tests' toy data.
    "translation": Task(
        "translation",
        ("de", "en"),
        "de-en",
        ("--task", "translation"),
        ("--share-all-embeddings",),
        ("dict.de.txt", "dict.en.txt", "valid.de-en.en.bin", "train.de-en.en.bin"),
    ),
    # The study's LM data options: 64-token blocks across sentence ends.
    "lm": Task(
        "lm",
        ("en",),
        "lm-en",
        ("--task", "language_modeling", "--tokens-per-sample", "64", "--sample-break-mode", "none"),
        ("--share-decoder-input-output-embed",),
        ("dict.txt", "valid.bin", "train.bin"),
    ),
}


def say(message):
    print(f"[step0-presets {time.strftime('%H:%M:%S')}] {message}", flush=True)


def presets():
    """(arch, task name) of every registered natbias preset, translation first."""
    from fairseq.models import ARCH_MODEL_REGISTRY, FairseqEncoderDecoderModel

    found = []
    for arch, model_class in ARCH_MODEL_REGISTRY.items():
        if arch.startswith(PREFIXES):
            # The model class, not the name, says which task builds it.
            task = "translation" if issubclass(model_class, FairseqEncoderDecoderModel) else "lm"
            found.append((arch, task))
    return sorted(found, key=lambda item: (item[1] != "translation", item[0]))


def arguments(arch, task, request, data_bin, save_dir):
    """fairseq-train's command line for one row, the natbias options left at
    their defaults."""
    tie = list(task.tie) if request == "tied" else []
    # save_dir holds no checkpoint: the model counts the unigram afresh
    # instead of expecting one to resume from.
    return [
        str(data_bin),
        "--user-dir",
        "fairseq_natbias",
        "--arch",
        arch,
        *task.options,
        *tie,
        "--cpu",
        "--seed",
        "1",
        "--save-dir",
        str(save_dir),
    ]


def tying(model_cfg):
    """What the built model shares, from its final config (the preset's
    choices included)."""
    for name in ("share_all_embeddings", "share_decoder_input_output_embed"):
        if getattr(model_cfg, name, False):
            return "--" + name.replace("_", "-")
    return None


def measure(arch, task, request, data_bin, save_dir):
    """One row: build, count the parameters, run the validation split at update 0."""
    started = time.time()
    cfg, fairseq_task, model = in_process.build_from_training_args(
        arguments(arch, task, request, data_bin, save_dir)
    )
    shared = tying(cfg.model)
    result = validation_divergence(fairseq_task, model)
    return {
        "preset": arch,
        "task": task.name,
        "request": request,
        "tying": "untied" if shared is None else f"tied ({shared})",
        "tied_by_preset": request == "untied" and shared is not None,
        # parameters() yields a shared matrix once, so tying shows here.
        "parameters": sum(p.numel() for p in model.parameters()),
        "nll": result["nll"],
        "unigram_ce": result["unigram_ce"],
        "kl_unigram": result["kl_unigram"],
        "tokens": result["tokens"],
        "difference": result["nll"] - result["unigram_ce"],
        "within": abs(result["nll"] - result["unigram_ce"]) <= WITHIN_BITS,
        "seconds": time.time() - started,
        "data": str(data_bin),
    }


def measure_preset(arch, task, data_bin, save_dir, known=None, on_row=None):
    """The rows of one preset: untied, then tied unless the untied build was
    tied already by the preset. ``known`` (key -> row) rows are reused;
    ``on_row(key, row)`` hears each new one (for the cache)."""
    rows = []
    for request in REQUESTS:
        if request == "tied" and rows[0]["tied_by_preset"]:
            say(f"{arch}: the preset ties by itself, no separate tied row")
            break
        key = f"{arch} {request}"
        row = (known or {}).get(key)
        if row is None:
            say(f"{key}: building and measuring")
            row = measure(arch, task, request, data_bin, save_dir)
            if on_row:
                on_row(key, row)
        else:
            say(f"{key}: measured before, skipped")
        say(
            f"{key}: NLL {row['nll']:.3f} bits, unigram {row['unigram_ce']:.3f}, "
            f"difference {row['difference']:+.3f}, {row['parameters']:,} parameters, "
            f"{row['seconds']:.0f} s"
        )
        rows.append(row)
    return rows


def complete(task, data_bin):
    return all((data_bin / name).exists() for name in task.needed)


def data_for(task, args):
    """The task's data-bin, prepared (or found prepared) in --workdir."""
    work = Path(args.workdir).resolve() / task.folder
    if not complete(task, work / "data-bin") and not has_all_files(Path(args.multi30k), task.langs):
        raise SystemExit(
            f"step0_presets: no Multi30k {'-'.join(task.langs)} at {args.multi30k}; "
            "give --multi30k DIR or set NATBIAS_MULTI30K"
        )
    work.mkdir(parents=True, exist_ok=True)
    return task.prepare(Path(args.multi30k), work)


def load_cache(path, data_bins):
    """Cached rows measured on the data used now (others would mix datasets)."""
    if not path.exists():
        return {}
    rows = json.loads(path.read_text())
    return {key: row for key, row in rows.items() if row["data"] in data_bins}


def save_cache(path, rows):
    temporary = path.with_suffix(".tmp")  # a killed run leaves the old cache whole
    temporary.write_text(json.dumps(rows, indent=1))
    temporary.replace(path)


COLUMNS = {  # header: the row's cell
    "preset": "{preset}",
    "task": "{task}",
    "tying": "{tying}",
    "parameters": "{parameters:,}",
    "NLL at update 0 (bits)": "{nll:.3f}",
    "unigram cross-entropy (bits)": "{unigram_ce:.3f}",
    "difference (bits)": "{difference:+.3f}",
    f"within {WITHIN_BITS} bits": "{verdict}",
    "KL(model ‖ unigram) (bits)": "{kl_unigram:.3f}",
    "seconds (build + measure)": "{seconds:.0f}",
}


def table_row(row):
    verdict = "yes" if row["within"] else "**no**"
    return (
        "| " + " | ".join(cell.format(**row, verdict=verdict) for cell in COLUMNS.values()) + " |"
    )


def markdown(rows, command, data, threads, note):
    import fairseq
    import torch

    tokens = {row["task"]: row["tokens"] for row in rows}
    head = [
        "# Step 0 of every registered preset on Multi30k",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {MACHINE} (torch {torch.__version__}, fairseq {fairseq.__version__}, "
        f"Python {platform.python_version()}); {threads} CPU thread(s)."
        + (f" {note}" if note else ""),
        "",
        "Each preset built as fairseq-train builds it (seed 1), the natbias options at the "
        "package's defaults; validation split, bits per target token. Translation: "
        f"Multi30k De-En, joint SentencePiece 8k, joined dictionary ({data.get('translation')}, "
        f"{tokens.get('translation', 0):,} target tokens). Language model: Multi30k English, "
        f"SentencePiece 8k, 64-token blocks ({data.get('lm')}, {tokens.get('lm', 0):,} tokens). "
        "Unigram cross-entropy: the validation targets under the model's own smoothed "
        "training unigram (the bias it starts from). Parameters: shared matrices counted once.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|---" * len(COLUMNS) + "|",
    ]
    missed = [f"{r['preset']} ({r['tying']})" for r in rows if not r["within"]]
    foot = [
        "",
        (
            f"Not within {WITHIN_BITS} bits: {', '.join(missed)}."
            if missed
            else f"Every row is within {WITHIN_BITS} bits of the unigram."
        ),
    ]
    return "\n".join(head + [table_row(row) for row in rows] + foot) + "\n"


def parse_arguments():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--multi30k", default=os.environ.get("NATBIAS_MULTI30K", "../shared/data/multi30k")
    )
    parser.add_argument(
        "--workdir",
        default="work/step0_presets",
        help="prepared data and the cache of measured rows",
    )
    parser.add_argument("--output", default=str(REPO / "research/results/step0_presets.md"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--note", help="said after the machine in the table")
    return parser.parse_args()


def main():
    args = parse_arguments()
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    logging.disable(logging.INFO)  # fairseq logs every build at INFO
    found = presets()
    say(f"{len(found)} presets: {', '.join(arch for arch, _ in found)}")
    data = {name: data_for(TASKS[name], args) for name in sorted({t for _, t in found})}
    workdir = Path(args.workdir).resolve()
    cache_path = workdir / CACHE_NAME
    cache = load_cache(cache_path, {str(path) for path in data.values()})

    def keep(key, row):
        cache[key] = row
        save_cache(cache_path, cache)

    save_dir = workdir / "no-checkpoints"
    rows = [
        row
        for arch, task in found
        for row in measure_preset(arch, TASKS[task], data[task], save_dir, cache, keep)
    ]
    command = f"{os.path.relpath(sys.executable, REPO)} {shlex.join(sys.argv)}"
    table = markdown(rows, command, data, args.threads, args.note)
    Path(args.output).write_text(table, encoding="utf-8")
    print(table)
    say(f"table written to {args.output}")


if __name__ == "__main__":
    main()
