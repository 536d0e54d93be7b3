"""natbias-demo (`make demo`): what a user gets, in miniature, on the CPU.

SentencePiece (joint) -> fairseq-preprocess -> train three small models with
the same sizes, seed and batches: transformer_natbias with its DEFAULT
settings (unigram bias, gain weight init), the same with --natbias-init zero,
and stock fairseq --arch transformer -> fairseq-generate (beam 5) -> a table
of validation NLL over updates and test BLEU/chrF from sacreBLEU, plus a plot.
Every step is skipped when its output exists, and an interrupted training
resumes from its last checkpoint.

Data (German->English): --data DIR holding {train,val,test}.{de,en}[.gz] (or
Multi30k's file names); else ../shared/data/multi30k; else Multi30k's public
files are downloaded; else a small synthetic corpus, announced as such.
"""

import argparse
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from fairseq_natbias.analysis import fairseq_logs, plots
from fairseq_natbias.analysis.generate_output import parse_generate_output
from fairseq_natbias.analysis.sweep import quality

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
SPLIT_FILES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
LANGS = ("de", "en")
# The runs compared: name -> model options.
ARMS = {
    "unigram": ["--arch", "transformer_natbias"],  # the defaults: unigram bias, gain init
    "zero": ["--arch", "transformer_natbias", "--natbias-init", "zero"],
    "stock": ["--arch", "transformer"],  # fairseq's own, what a user would otherwise run
}

MODEL = ("--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 128 "
         "--decoder-embed-dim 128 --encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256 "
         "--encoder-attention-heads 4 --decoder-attention-heads 4 --share-all-embeddings").split()
TRAINING = ("--cpu --seed 1 --optimizer adam --adam-betas (0.9,0.997) --lr 1e-3 "
            "--lr-scheduler inverse_sqrt --warmup-updates 100 --dropout 0.1 "
            "--criterion label_smoothed_cross_entropy --label-smoothing 0.1 "
            "--max-tokens 3000 --log-format json --log-interval 25 --num-workers 0 "
            "--no-epoch-checkpoints --save-interval-updates 50 "
            "--keep-interval-updates 1 --validate-interval-updates 50 "
            "--no-progress-bar").split()


def say(message):
    print(f"[natbias-demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def tool(name):
    return str(Path(sys.executable).parent / name)


def run(command, log_path=None, on_line=None):
    """Run a real CLI; stream its output into log_path and to on_line."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=env) as process:
        log = open(log_path, "a", encoding="utf-8", buffering=1) if log_path else None
        lines = []
        for line in process.stdout:
            lines.append(line)
            if log:
                log.write(line)
            if on_line:
                on_line(line)
        if log:
            log.close()
    if process.returncode != 0:
        tail = "".join(lines[-30:])
        raise SystemExit(f"natbias-demo: {Path(command[0]).name} failed:\n{tail}")
    return "".join(lines)


# --- data ----------------------------------------------------------------------


def find_raw_data(given, work):
    candidates = [Path(given)] if given else []
    candidates.append(Path(os.environ.get("NATBIAS_MULTI30K", "../shared/data/multi30k")))
    for folder in candidates:
        if has_all_files(folder):
            say(f"data: Multi30k-style parallel text from {folder}")
            return folder
        if given and folder == Path(given):
            raise SystemExit(f"natbias-demo: {folder} lacks {{train,val,test_2016_flickr}}"
                             ".{de,en}[.gz]; give a folder with those files")
    downloaded = work / "download"
    if _download_multi30k(downloaded):
        return downloaded
    say("data: NO real data found or downloadable; using a small SYNTHETIC corpus "
        "(BLEU on it means nothing about language)")
    return _synthetic_corpus(work / "synthetic")


def raw_file(folder, split, lang):
    for name in (SPLIT_FILES[split], split):
        for suffix in (".gz", ""):
            path = Path(folder) / f"{name}.{lang}{suffix}"
            if path.exists():
                return path
    return None


def has_all_files(folder, langs=LANGS):
    return all(raw_file(folder, s, l) for s in SPLIT_FILES for l in langs)


def _download_multi30k(target):
    if has_all_files(target):
        return True
    say(f"data: downloading Multi30k from {MULTI30K_URL}")
    target.mkdir(parents=True, exist_ok=True)
    try:
        for split, name in SPLIT_FILES.items():
            for lang in LANGS:
                url = f"{MULTI30K_URL}{name}.{lang}.gz"
                with urllib.request.urlopen(url, timeout=20) as response:
                    (target / f"{name}.{lang}.gz").write_bytes(response.read())
        return True
    except OSError as error:
        say(f"data: download failed ({error})")
        shutil.rmtree(target, ignore_errors=True)
        return False


def _synthetic_corpus(target):
    rng = random.Random(0)
    words = {lang: [f"{lang}{i}" for i in range(300)] for lang in LANGS}
    weights = [1 / (i + 1) for i in range(300)]
    target.mkdir(parents=True, exist_ok=True)
    for split, size in (("train", 6000), ("valid", 300), ("test", 300)):
        ids = [rng.choices(range(300), weights, k=rng.randint(4, 14)) for _ in range(size)]
        for lang in LANGS:
            lines = [" ".join(words[lang][i] for i in sent) for sent in ids]
            (target / f"{SPLIT_FILES[split]}.{lang}").write_text("\n".join(lines) + "\n")
    return target


def read_lines(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [line.strip() for line in handle]


# --- pipeline steps ------------------------------------------------------------


def prepare(raw, work, vocab_size, langs=LANGS):
    """Joint SentencePiece over both sides, then fairseq-preprocess with one
    joined dictionary; ``langs`` is (source, target)."""
    source, target = langs
    data_bin = work / "data-bin"
    if (data_bin / f"test.{source}-{target}.{target}.bin").exists():
        say(f"preprocess: {data_bin} exists, skipped")
        return data_bin
    text = encode_with_sentencepiece(raw, work, langs, vocab_size)
    say("fairseq-preprocess (joined dictionary)")
    run([tool("fairseq-preprocess"), "--source-lang", source, "--target-lang", target,
         "--trainpref", f"{text}/train", "--validpref", f"{text}/valid",
         "--testpref", f"{text}/test", "--destdir", str(data_bin),
         "--joined-dictionary", "--workers", "2"], log_path=work / "preprocess.log")
    return data_bin


def prepare_lm(raw, work, vocab_size, lang="en"):
    """One language's text for ``--task language_modeling``: SentencePiece on
    it, then ``fairseq-preprocess --only-source``."""
    data_bin = work / "data-bin"
    if (data_bin / "test.bin").exists():
        say(f"preprocess: {data_bin} exists, skipped")
        return data_bin
    text = encode_with_sentencepiece(raw, work, (lang,), vocab_size)
    say("fairseq-preprocess --only-source (language model)")
    run([tool("fairseq-preprocess"), "--only-source",
         "--trainpref", f"{text}/train.{lang}", "--validpref", f"{text}/valid.{lang}",
         "--testpref", f"{text}/test.{lang}", "--destdir", str(data_bin),
         "--workers", "2"], log_path=work / "preprocess.log")
    return data_bin


def encode_with_sentencepiece(raw, work, langs, vocab_size):
    """work/text/{split}.raw.{lang} and their pieces work/text/{split}.{lang},
    with one SentencePiece unigram model (work/spm.model) trained on the
    training text of every language in ``langs``."""
    import sentencepiece as spm

    text = work / "text"
    text.mkdir(parents=True, exist_ok=True)
    for split in SPLIT_FILES:
        for lang in langs:
            (text / f"{split}.raw.{lang}").write_text(
                "\n".join(read_lines(raw_file(raw, split, lang))) + "\n", encoding="utf-8")
    say(f"sentencepiece: {'joint ' if len(langs) > 1 else ''}unigram model, {vocab_size} pieces")
    spm.SentencePieceTrainer.train(
        input=",".join(f"{text}/train.raw.{lang}" for lang in langs),
        model_prefix=str(work / "spm"),
        vocab_size=vocab_size, model_type="unigram", character_coverage=1.0,
        bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0, minloglevel=2, hard_vocab_limit=False,
    )
    model = spm.SentencePieceProcessor(model_file=str(work / "spm.model"))
    for split in SPLIT_FILES:
        for lang in langs:
            lines = (text / f"{split}.raw.{lang}").read_text(encoding="utf-8").splitlines()
            pieces = [" ".join(model.encode(line, out_type=str)) for line in lines]
            (text / f"{split}.{lang}").write_text("\n".join(pieces) + "\n", encoding="utf-8")
    return text


def train(data_bin, run_dir, init, max_update):
    """Train the arm ``init`` (a key of ARMS) for max_update updates."""
    done = run_dir / "done"
    if done.exists():
        say(f"train [{init}]: finished before, skipped")
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    say(f"train [{init}]: {max_update} updates on the CPU "
        f"(resumes from {run_dir}/checkpoint_last.pt if present)")

    def progress(line):
        record = fairseq_logs.parse_line(line.rstrip("\n"))
        if record and record.tag == fairseq_logs.VALID and "nll_loss" in record.values:
            say(f"train [{init}]: update {record.num_updates}/{max_update} "
                f"valid NLL {record.values['nll_loss']} bits")

    # --user-dir for stock too: it adds names only, and lets torch >= 2.6 load
    # fairseq checkpoints (fairseq_natbias/checkpoint_loading.py).
    arguments = [str(data_bin), "--user-dir", "fairseq_natbias", *ARMS[init], *MODEL,
                 *TRAINING, "--max-update", str(max_update), "--save-dir", str(run_dir)]
    record_step0(arguments, run_dir / "step0.json")
    run([tool("fairseq-train"), *arguments], log_path=run_dir / "train.log", on_line=progress)
    done.touch()


def record_step0(arguments, path):
    """Validation NLL before any update (fairseq first validates after training)."""
    if path.exists():
        return
    output = run([tool("natbias-step0"), *arguments])
    path.write_text([line for line in output.splitlines() if line.startswith("{")][-1])


def evaluate(data_bin, work, run_dir, init, target=LANGS[1]):
    scores_path = run_dir / "test_scores.json"
    if scores_path.exists():
        say(f"generate [{init}]: scored before, skipped")
        return json.loads(scores_path.read_text())
    say(f"generate [{init}]: beam 5 on the test set, then sacreBLEU")
    output = run([tool("fairseq-generate"), str(data_bin), "--user-dir", "fairseq_natbias",
                  "--path", str(run_dir / "checkpoint_best.pt"), "--beam", "5",
                  "--lenpen", "1.0", "--max-len-a", "1.2", "--max-len-b", "10",
                  "--required-batch-size-multiple", "1",
                  "--cpu", "--batch-size", "128",
                  "--remove-bpe", "sentencepiece", "--num-workers", "0"])
    sentences = parse_generate_output(output.splitlines())
    ordered = [(sentences[i].detokenized if i in sentences else None) or ""
               for i in range(len(sentences))]
    (run_dir / "test.hyp").write_text("\n".join(ordered) + "\n", encoding="utf-8")
    references = (work / f"text/test.raw.{target}").read_text(encoding="utf-8").splitlines()
    scores = sacrebleu_scores(ordered, references[: len(ordered)])
    scores_path.write_text(json.dumps(scores, indent=1))
    return scores


def sacrebleu_scores(hypotheses, references):
    """BLEU and chrF with their signatures (natbias-sweep's scorer)."""
    scores = quality(hypotheses, references)
    return {"bleu": round(scores["BLEU"], 2), "bleu_signature": scores["bleu_signature"],
            "chrf": round(scores["chrF"], 2), "chrf_signature": scores["chrf_signature"]}


# --- report --------------------------------------------------------------------


def validation_curve(run_dir, key="nll_loss"):
    """Validation NLL (bits/token; logged as ``key``) by update, update 0 from
    natbias-step0."""
    records = fairseq_logs.read_log(str(run_dir / "train.log"))
    updates, values = fairseq_logs.series(records, fairseq_logs.VALID, key)
    curve = {0: json.loads((run_dir / "step0.json").read_text())["nll"]}
    curve.update({int(u): float(v) for u, v in zip(updates, values)})
    return curve


def report(work, results):
    curves = {init: validation_curve(work / init) for init in ARMS}
    updates = sorted(set().union(*curves.values()))
    lines = ["## Validation NLL (bits/token) over updates", "",
             "| update | " + " | ".join(ARMS) + " |", "|---|" + "---|" * len(ARMS)]
    for update in updates:
        cells = [f"{curves[i][update]:.3f}" if update in curves[i] else "" for i in ARMS]
        lines.append(f"| {update} | " + " | ".join(cells) + " |")
    lines += ["", "## Test (best checkpoint, beam 5)", "", "| run | BLEU | chrF |",
              "|---|---|---|"]
    for init in ARMS:
        lines.append(f"| {init} | {results[init]['bleu']} | {results[init]['chrf']} |")
    first = results[next(iter(ARMS))]
    lines += ["", "unigram: transformer_natbias with its default settings; zero: the same "
              "with --natbias-init zero; stock: fairseq's --arch transformer, same sizes.",
              "", f"BLEU signature: `{first['bleu_signature']}`",
              f"chrF signature: `{first['chrf_signature']}`"]
    table = "\n".join(lines) + "\n"
    (work / "report.md").write_text(table)
    plot_curves(curves, work / "valid_nll.png")
    return table


def plot_curves(curves, path):
    lines = [{"label": init, "x": sorted(curve),
              "mean": [curve[u] for u in sorted(curve)],
              "low": [curve[u] for u in sorted(curve)],
              "high": [curve[u] for u in sorted(curve)]} for init, curve in curves.items()]
    plots.curve_panels({"Multi30k De-En (demo)": lines}, "validation NLL (bits/token)",
                       str(path), logx=False)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="natbias-demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="folder of raw parallel text (see above)")
    parser.add_argument("--output", default="demo_output", help="work folder (default: %(default)s)")
    parser.add_argument("--max-update", type=int, default=250)
    parser.add_argument("--vocab-size", type=int, default=8000)
    args = parser.parse_args(argv)
    work = Path(args.output).resolve()
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    raw = find_raw_data(args.data, work)
    data_bin = prepare(raw, work, args.vocab_size)
    results = {}
    for init in ARMS:
        train(data_bin, work / init, init, args.max_update)
        results[init] = evaluate(data_bin, work, work / init, init)
    print("\n" + report(work, results))
    say(f"done in {time.time() - started:.0f} s; outputs in {work}: report.md, "
        f"valid_nll.png, {{{','.join(ARMS)}}}/train.log, checkpoints, test.hyp")


if __name__ == "__main__":
    main()
