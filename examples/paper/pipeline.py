"""The pipeline steps of make demo (demo.py) and the learning-efficiency study, each
through the real command a user would type: SentencePiece, fairseq-preprocess
(:func:`prepare`, :func:`prepare_lm`), natbias-step0 and fairseq-train
(:func:`train`), fairseq-generate and sacreBLEU (:func:`evaluate`), validation
NLL by update (:func:`validation_curve`). Every step skips its work when its
output exists; an interrupted fairseq-train resumes from checkpoint_last.pt.
In process: :func:`build_from_training_args` and :func:`validation_divergence`
(natbias-step0).
"""

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from multi30k import LANGS, SPLIT_FILES, raw_file, read_lines
from quality import quality

from natbias.tools import fairseq_logs, sentencepiece_text
from natbias.tools.generate_output import parse_generate_output

MODEL = (
    "--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 128 "
    "--decoder-embed-dim 128 --encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256 "
    "--encoder-attention-heads 4 --decoder-attention-heads 4 --share-all-embeddings"
).split()
TRAINING = (
    "--cpu --seed 1 --optimizer adam --adam-betas (0.9,0.997) --lr 1e-3 "
    "--lr-scheduler inverse_sqrt --warmup-updates 100 --dropout 0.1 "
    "--criterion label_smoothed_cross_entropy --label-smoothing 0.1 "
    "--max-tokens 3000 --log-format json --log-interval 25 --num-workers 0 "
    "--no-epoch-checkpoints --save-interval-updates 50 "
    "--keep-interval-updates 1 --validate-interval-updates 50 "
    "--no-progress-bar"
).split()
LN2 = math.log(2.0)


# How the test set is translated (the demo's and the studies' scores): beam 5,
# every sentence (fairseq 0.12 drops a last partial batch otherwise), no
# data-loader process.
TEST_DECODING = (
    "--gen-subset test --beam 5 --lenpen 1.0 --max-len-a 1.2 --max-len-b 10 "
    "--required-batch-size-multiple 1 --batch-size 128 --remove-bpe sentencepiece --num-workers 0"
).split()


def say(message):
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


# The module behind each console script, for a Python whose folder lacks the
# scripts (packages installed with ``pip install --target DIR``).
TOOL_MODULES = {
    "fairseq-train": "fairseq_cli.train",
    "fairseq-preprocess": "fairseq_cli.preprocess",
    "fairseq-generate": "fairseq_cli.generate",
    "fairseq-eval-lm": "fairseq_cli.eval_lm",
    "natbias-step0": "fairseq_natbias.cli.step0",
    "torchrun": "torch.distributed.run",
}


def tool(name):
    """The command ``name`` of this Python environment as the start of a command
    line: the script beside ``sys.executable``, else ``sys.executable -m MODULE``,
    else the script on PATH. FileNotFoundError if none."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    if name in TOOL_MODULES:
        return [sys.executable, "-m", TOOL_MODULES[name]]
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name}: not beside {sys.executable} and not on PATH")
    return [found]


def run(command, log_path=None, on_line=None):
    """Run a real CLI; stream its output into log_path and to on_line."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as process:
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
        raise SystemExit(f"demo: {Path(command[0]).name} failed:\n{tail}")
    return "".join(lines)


def _write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def prepare(raw, work, vocab_size, langs=LANGS):
    """Joint SentencePiece, then fairseq-preprocess with one joined dictionary;
    ``langs`` is (source, target)."""
    source, target = langs
    data_bin = work / "data-bin"
    if (data_bin / f"test.{source}-{target}.{target}.bin").exists():
        say(f"preprocess: {data_bin} exists, skipped")
        return data_bin
    text = encode_with_sentencepiece(raw, work, langs, vocab_size)
    say("fairseq-preprocess (joined dictionary)")
    run(
        [
            *tool("fairseq-preprocess"),
            "--source-lang",
            source,
            "--target-lang",
            target,
            "--trainpref",
            f"{text}/train",
            "--validpref",
            f"{text}/valid",
            "--testpref",
            f"{text}/test",
            "--destdir",
            str(data_bin),
            "--joined-dictionary",
            "--workers",
            "2",
        ],
        log_path=work / "preprocess.log",
    )
    return data_bin


def prepare_lm(raw, work, vocab_size, lang="en"):
    """One language's text, SentencePiece, then ``fairseq-preprocess --only-source``."""
    data_bin = work / "data-bin"
    if (data_bin / "test.bin").exists():
        say(f"preprocess: {data_bin} exists, skipped")
        return data_bin
    text = encode_with_sentencepiece(raw, work, (lang,), vocab_size)
    say("fairseq-preprocess --only-source (language model)")
    run(
        [
            *tool("fairseq-preprocess"),
            "--only-source",
            "--trainpref",
            f"{text}/train.{lang}",
            "--validpref",
            f"{text}/valid.{lang}",
            "--testpref",
            f"{text}/test.{lang}",
            "--destdir",
            str(data_bin),
            "--workers",
            "2",
        ],
        log_path=work / "preprocess.log",
    )
    return data_bin


def encode_with_sentencepiece(raw, work, langs, vocab_size):
    """work/text/{split}.raw.{lang} and their pieces work/text/{split}.{lang}, with
    one SentencePiece model (work/spm.model) trained on the training text of ``langs``."""
    text = work / "text"
    text.mkdir(parents=True, exist_ok=True)
    for split in SPLIT_FILES:
        for lang in langs:
            _write_lines(text / f"{split}.raw.{lang}", read_lines(raw_file(raw, split, lang)))
    say(f"sentencepiece: {'joint ' if len(langs) > 1 else ''}unigram model, {vocab_size} pieces")
    sentencepiece_text.train(
        [text / f"train.raw.{lang}" for lang in langs], work / "spm", vocab_size
    )
    processor = sentencepiece_text.load(work / "spm.model")
    for split in SPLIT_FILES:
        for lang in langs:
            lines = (text / f"{split}.raw.{lang}").read_text(encoding="utf-8").splitlines()
            _write_lines(
                text / f"{split}.{lang}", sentencepiece_text.encode_lines(processor, lines)
            )
    return text


def prepare_test_set(raw, work, data_bin, langs, test_set):
    """A further test set (a file stem such as ``test_2017_flickr``), encoded with
    work/spm.model and binarised with data_bin's dictionaries as the ``test``
    split of work/data-bin-<test_set>, for :func:`evaluate`'s ``test_set``."""
    source, target = langs
    destination, text = work / f"data-bin-{test_set}", work / f"text-{test_set}"
    if (destination / f"test.{source}-{target}.{target}.bin").exists():
        return destination
    text.mkdir(parents=True, exist_ok=True)
    processor = sentencepiece_text.load(work / "spm.model")
    for lang in langs:
        path = raw_file(raw, test_set, lang)
        if path is None:
            raise SystemExit(f"demo: no {test_set}.{lang}[.gz] in {raw}")
        lines = read_lines(path)
        _write_lines(text / f"test.raw.{lang}", lines)
        _write_lines(text / f"test.{lang}", sentencepiece_text.encode_lines(processor, lines))
    say(f"fairseq-preprocess {test_set} with {data_bin}'s dictionaries")
    run(
        [
            *tool("fairseq-preprocess"),
            "--source-lang",
            source,
            "--target-lang",
            target,
            "--testpref",
            f"{text}/test",
            "--destdir",
            str(destination),
            "--srcdict",
            str(data_bin / f"dict.{source}.txt"),
            "--tgtdict",
            str(data_bin / f"dict.{target}.txt"),
            "--workers",
            "2",
        ],
        log_path=work / f"preprocess-{test_set}.log",
    )
    return destination


def train_command(data_bin, run_dir, options, max_update):
    """fairseq-train's arguments: ``options`` on ``data_bin`` for ``max_update``
    updates, saving into ``run_dir``."""
    # --user-dir for stock fairseq too: it lets torch >= 2.6 load fairseq checkpoints
    return [
        str(data_bin),
        "--user-dir",
        "fairseq_natbias",
        *options,
        "--max-update",
        str(max_update),
        "--save-dir",
        str(run_dir),
    ]


def train(arguments, run_dir, on_line=None):
    """natbias-step0, then fairseq-train ``arguments`` logging to run_dir/train.log
    (each line to ``on_line``); run_dir/done marks the run finished."""
    run_dir.mkdir(parents=True, exist_ok=True)
    record_step0(arguments, run_dir / "step0.json")
    run([*tool("fairseq-train"), *arguments], log_path=run_dir / "train.log", on_line=on_line)
    (run_dir / "done").touch()


def record_step0(arguments, path):
    """Validation NLL before any update (fairseq first validates after training)."""
    if path.exists():
        return
    output = run([*tool("natbias-step0"), *arguments])
    path.write_text([line for line in output.splitlines() if line.startswith("{")][-1])


def on_validation(key, report):
    """An ``on_line`` for :func:`run`: ``report(record)`` for each validation line logging ``key``."""

    def on_line(line):
        record = fairseq_logs.parse_line(line.rstrip("\n"))
        if record and record.tag == fairseq_logs.VALID and key in record.values:
            report(record)

    return on_line


def validation_curve(run_dir, key="nll_loss"):
    """Validation NLL (bits/token, logged as ``key``) by update; update 0 from natbias-step0."""
    records = fairseq_logs.read_log(str(run_dir / "train.log"))
    updates, values = fairseq_logs.series(records, fairseq_logs.VALID, key)
    curve = {0: json.loads((run_dir / "step0.json").read_text())["nll"]}
    curve.update({int(u): float(v) for u, v in zip(updates, values)})
    return curve


def evaluate(data_bin, work, run_dir, name, target=LANGS[1], test_set=None, cpu=True):
    """Test BLEU/chrF of run_dir/checkpoint_best.pt (beam 5), kept in
    run_dir/test_scores.json, the detokenised hypotheses in run_dir/test.hyp;
    ``test_set`` (prepared by :func:`prepare_test_set`) scores that set instead,
    into run_dir/<test_set>_scores.json and .hyp. ``cpu=False`` decodes on the GPU."""
    stem = test_set or "test"
    scores_path = run_dir / ("test_scores.json" if test_set is None else f"{stem}_scores.json")
    if scores_path.exists():
        say(f"generate [{name}]: {'' if test_set is None else stem + ' '}scored before, skipped")
        return json.loads(scores_path.read_text())
    if test_set is not None:
        data_bin, text = work / f"data-bin-{stem}", work / f"text-{stem}"
    else:
        text = work / "text"
    say(
        f"generate [{name}]: beam 5 on {'the test set' if test_set is None else stem}, "
        "then sacreBLEU"
    )
    output = run(
        [
            *tool("fairseq-generate"),
            str(data_bin),
            "--user-dir",
            "fairseq_natbias",
            "--path",
            str(run_dir / "checkpoint_best.pt"),
            *TEST_DECODING,
            *(["--cpu"] if cpu else []),
        ]
    )
    sentences = parse_generate_output(output.splitlines())
    ordered = [
        (sentences[i].detokenized if i in sentences else None) or "" for i in range(len(sentences))
    ]
    (run_dir / f"{stem}.hyp").write_text("\n".join(ordered) + "\n", encoding="utf-8")
    references = (text / f"test.raw.{target}").read_text(encoding="utf-8").splitlines()
    scores = quality(ordered, references[: len(ordered)])
    scores = {
        "bleu": round(scores["BLEU"], 2),
        "bleu_signature": scores["bleu_signature"],
        "chrf": round(scores["chrF"], 2),
        "chrf_signature": scores["chrf_signature"],
    }
    scores_path.write_text(json.dumps(scores, indent=1))
    return scores
