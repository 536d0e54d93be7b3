"""Shared helpers for the tests: tiny model settings and the real fairseq CLIs."""

import os
import re
import subprocess
import sys
from pathlib import Path

import fork_server

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# Where the real parallel text lives: ../shared beside the checkout, or a path
# given in NATBIAS_MULTI30K.
MULTI30K = Path(os.environ.get("NATBIAS_MULTI30K", REPO.parent / "shared/data/multi30k"))


def skip_without_data(what):
    """Skips the test where ``what`` (the data, where it was looked for, how
    to give it) is absent; under CI (CI=true), where the data must be, fails
    it instead: a headline test skipped there would pass unseen."""
    import pytest

    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"missing data, and CI=true: {what}", pytrace=False)
    pytest.skip(f"missing data: {what}")


def top_level_imports(stderr):
    """Top-level module names from ``python -X importtime``'s report (a
    process run with PYTHONPROFILEIMPORTTIME=1)."""
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def write_multi30k_slice(root, counts):
    """The first ``counts[name]`` lines of Multi30k's German and English
    ``name`` splits, as plain text in ``root`` (skips the test without the data)."""
    import gzip

    if not (MULTI30K / "train.de.gz").exists():
        skip_without_data(f"Multi30k not found at {MULTI30K} (set NATBIAS_MULTI30K)")
    for name, count in counts.items():
        for lang in ("de", "en"):
            with gzip.open(MULTI30K / f"{name}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(count)]
            (Path(root) / f"{name}.{lang}").write_text("".join(lines), encoding="utf-8")
    return root


def sacrebleu_scores(hypotheses, references):
    """BLEU and chrF from sacreBLEU's Python API, not its command line nor
    the examples' scoring: what a user gets scoring the hypotheses written."""
    import sacrebleu

    return (
        sacrebleu.corpus_bleu(hypotheses, [references]).score,
        sacrebleu.corpus_chrf(hypotheses, [references]).score,
    )


# fairseq-generate's, -eval-lm's and -validate's default of one data-loader
# worker forks the whole command's process: seconds each for a tiny run.
NO_LOADER_PROCESS = ["--num-workers", "0"]

TINY_MODEL = [
    "--encoder-layers",
    "2",
    "--decoder-layers",
    "2",
    "--encoder-embed-dim",
    "64",
    "--decoder-embed-dim",
    "64",
    "--encoder-ffn-embed-dim",
    "128",
    "--decoder-ffn-embed-dim",
    "128",
    "--encoder-attention-heads",
    "2",
    "--decoder-attention-heads",
    "2",
]

TINY_TRAINING = [
    "--cpu",
    "--seed",
    "1",
    "--num-workers",
    "0",
    "--optimizer",
    "adam",
    "--adam-betas",
    "(0.9, 0.997)",
    "--lr",
    "1e-3",
    "--lr-scheduler",
    "inverse_sqrt",
    "--warmup-updates",
    "10",
    "--criterion",
    "label_smoothed_cross_entropy",
    "--label-smoothing",
    "0.1",
    "--max-tokens",
    "2000",
    "--log-format",
    "simple",
    "--log-interval",
    "1",
    "--no-epoch-checkpoints",
    "--no-progress-bar",
]


def fairseq(tool, *args, cwd=None, check=True, env=None):
    """Run a real fairseq entry point (fairseq-train, fairseq-generate, ...),
    one of this package's console scripts, or a script of the repository
    (``examples/paper/frequency.py``) as a process of its own, forked from
    this run's server (tests/fork_server.py) that imported fairseq once;
    returns a CompletedProcess. NATBIAS_TESTS_SUBPROCESS=1 runs the installed
    scripts instead, to check that both give the same results.
    """
    full_env = dict(PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    full_env.update(env or {})
    result = subprocess.run(
        [*command_of(tool), *map(str, args)],
        cwd=cwd or REPO,
        env=dict(os.environ, **full_env),
        capture_output=True,
        text=True,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{tool} failed ({result.returncode}):\n{result.stdout[-4000:]}\n"
            f"{result.stderr[-6000:]}"
        )
    return result


def command_of(tool):
    """The start of the command line that runs ``tool``: an installed console
    script, or a repository script (a path ending in .py) run by Python,
    each served by the run's fork server unless NATBIAS_TESTS_SUBPROCESS=1."""
    if tool.endswith(".py"):
        return [script_python(), str(REPO / tool)]
    if fork_server.shims_enabled() and fork_server.serves(tool):
        return [str(fork_server.shim_directory(BIN) / tool)]
    return [str(BIN / tool)]


def console_script_help(tool):
    """``TOOL --help`` of an installed console script of this package (or a
    repository script); the text it printed."""
    assert tool.endswith(".py") or (BIN / tool).is_file(), f"{tool} is not installed in {BIN}"
    return fairseq(tool, "--help").stdout


def load_fairseq_model(checkpoint, data, **overrides):
    """``(model in eval mode, task)`` by fairseq's own loading, ``data`` and
    ``overrides`` given as ``--model-overrides``. The plugin is imported first,
    as ``--user-dir`` has it: its import lets torch's loader read fairseq's
    checkpoints (without it a test passed only after another had imported it)."""
    from fairseq import checkpoint_utils

    import fairseq_natbias  # noqa: F401

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint)], arg_overrides={"data": str(data), **overrides}
    )
    return models[0].eval(), task


def train(
    data,
    save_dir,
    *extra,
    arch="transformer_natbias",
    cwd=None,
    check=True,
    model=TINY_MODEL,
    max_update=4,
):
    return fairseq(
        "fairseq-train",
        data,
        "--user-dir",
        "fairseq_natbias",
        "--arch",
        arch,
        *model,
        *TINY_TRAINING,
        "--save-dir",
        save_dir,
        "--max-update",
        max_update,
        *extra,
        cwd=cwd,
        check=check,
    )


TINY_LM = [
    "--decoder-layers",
    "2",
    "--decoder-embed-dim",
    "64",
    "--decoder-ffn-embed-dim",
    "128",
    "--decoder-attention-heads",
    "2",
]

TINY_LM_TRAINING = [
    "--task",
    "language_modeling",
    "--tokens-per-sample",
    "32",
    "--cpu",
    "--seed",
    "1",
    "--num-workers",
    "0",
    "--optimizer",
    "adam",
    "--adam-betas",
    "(0.9, 0.997)",
    "--lr",
    "1e-3",
    "--lr-scheduler",
    "inverse_sqrt",
    "--warmup-updates",
    "10",
    "--criterion",
    "cross_entropy",
    "--max-tokens",
    "1024",
    "--log-format",
    "simple",
    "--log-interval",
    "1",
    "--no-epoch-checkpoints",
    "--no-progress-bar",
]


def train_lm(
    data,
    save_dir,
    *extra,
    arch="transformer_lm_natbias",
    cwd=None,
    check=True,
    model=TINY_LM,
    max_update=4,
):
    """fairseq-train --task language_modeling with a tiny transformer LM."""
    return fairseq(
        "fairseq-train",
        data,
        "--user-dir",
        "fairseq_natbias",
        "--arch",
        arch,
        *model,
        *TINY_LM_TRAINING,
        "--save-dir",
        save_dir,
        "--max-update",
        max_update,
        *extra,
        cwd=cwd,
        check=check,
    )


def free_port():
    """A TCP port on the loopback that no one listens on now (a rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_records(text, tag="train_inner"):
    """Parse fairseq's simple-format log lines with this tag into dicts."""
    records = []
    for line in text.splitlines():
        if f"| {tag} |" not in line:
            continue
        body = line.split(f"| {tag} |", 1)[1]
        record = {}
        for key, value in re.findall(r"(\w+)[ =]([-+\d.eE]+|inf|nan)(?=,|\s*\||\s*$)", body):
            try:
                record[key] = float(value)
            except ValueError:
                pass
        records.append(record)
    return records


# --- in-process fairseq: the objects fairseq-train builds, without a subprocess --


def build_in_process(data, save_dir, *extra, arch="transformer_natbias", model=TINY_MODEL):
    """Parse a fairseq-train command line here and build its task, model and
    criterion the way fairseq-train does. ``save_dir`` must hold no checkpoint
    (the model would otherwise skip counting, as for a resumed run)."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        [
            str(data),
            "--user-dir",
            str(REPO / "fairseq_natbias"),
            "--arch",
            arch,
            *model,
            *TINY_TRAINING,
            "--save-dir",
            str(save_dir),
            *map(str, extra),
        ],
    )
    cfg = convert_namespace_to_omegaconf(args)
    utils.set_torch_seed(cfg.common.seed)  # as fairseq-train: same init every call
    task = tasks.setup_task(cfg.task)
    built = task.build_model(cfg.model)
    return task, built, task.build_criterion(cfg.criterion)


def first_sentences(task, split="train", n=24):
    """A collated batch of the first ``n`` sentences of a split."""
    task.load_dataset(split)
    dataset = task.dataset(split)
    return dataset.collater([dataset[i] for i in range(min(n, len(dataset)))])


def reference_log_unigram(text_paths, dictionary, alpha=1.0, extra=None, weights=None):
    """Log add-alpha unigram of tokenised text (a file, or several), counted
    here in float64 independently of natbias.counts: every word as the
    dictionary maps it, plus one EOS per line (what fairseq-preprocess
    binarises); ``weights``, one per file, multiplies that file's counts (a
    sampled mixture); ``extra``, counts by id added to those (language tokens)."""
    import math
    from collections import Counter

    import torch

    paths = [text_paths] if isinstance(text_paths, (str, Path)) else text_paths
    weights = [1.0] * len(paths) if weights is None else weights
    counts = Counter(extra or {})
    for path, weight in zip(paths, weights, strict=True):
        file_counts = Counter()
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            file_counts.update(dictionary.index(word) for word in line.split())
            file_counts[dictionary.eos()] += 1
        counts.update({token: weight * n for token, n in file_counts.items()})
    total = sum(counts.values()) + alpha * len(dictionary)
    return torch.tensor(
        [math.log((counts[i] + alpha) / total) for i in range(len(dictionary))], dtype=torch.float64
    )


# --- recipes (recipes/*/run.sh) ---------------------------------------------------

RECIPES = REPO / "recipes"

# Multi30k as a recipe's local raw text (RAW_DIR): its splits are named
# train / val / test_2016_flickr, with test_2017_flickr as a second test set.
MULTI30K_RAW = {
    "RAW_DIR": str(MULTI30K),
    "RAW_TRAIN": "train",
    "RAW_VALID": "val",
    "RAW_TEST": "test_2016_flickr",
}


def multi30k_has(*langs):
    return all((MULTI30K / f"train.{lang}.gz").exists() for lang in langs)


# NAME=${NAME-value}  # comment. The value may hold "}" (work/${SRC}_${TGT}), the
# comment too ("{lang}"): the value ends at the first "}" followed by the comment
# or the line's end.
SETTING_LINE = re.compile(r"^([A-Z][A-Z0-9_]*)=\$\{\1-(.*?)\}\s*(#.*)?$")


def setting_lines(path):
    """(name, value, comment) of each setting line of a recipe file (a run.sh or
    recipes/defaults.sh), in order; value as written (quotes kept)."""
    found = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if re.match(r"[A-Z][A-Z0-9_]*=\$\{", line):
            match = SETTING_LINE.match(line)
            assert match, f"{path}: not NAME=${{NAME-value}}  # comment: {line}"
            found.append((match[1], match[2], match[3] or ""))
    return found


def recipe_settings(script=None):
    """Names of the settings a recipe uses: all of recipes/defaults.sh's, in its
    order, then any its run.sh sets that defaults.sh lacks; defaults.sh's alone
    without ``script``."""
    names = [name for name, _, _ in setting_lines(RECIPES / "defaults.sh")]
    if script:
        names += [name for name, _, _ in setting_lines(script) if name not in names]
    return names


def script_path():
    """PATH for the scripts the tests run: fairseq's tools served by this
    run's fork server first (tests/fork_server.py), then the environment's."""
    path = [str(BIN), os.environ.get("PATH", "")]
    if fork_server.shims_enabled():
        path.insert(0, str(fork_server.shim_directory(BIN)))
    return os.pathsep.join(path)


def script_python():
    """The Python for the scripts the tests run that find fairseq's tools
    beside ``sys.executable``: the fork server's ``python``, beside its tools."""
    if fork_server.shims_enabled():
        return str(fork_server.served_python(BIN))
    return sys.executable


def recipe_env(env=None):
    """Smoke mode on CPU, the repository's fairseq on PATH, and none of the
    recipe settings of the caller's shell: only ``env``'s."""
    full_env = {k: v for k, v in os.environ.items() if k not in recipe_settings()}
    full_env.update(
        PATH=script_path(), PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", SMOKE="1", NGPUS="0"
    )
    full_env.update({k: str(v) for k, v in (env or {}).items()})
    return full_env


def _checked(script, result, check):
    if check and result.returncode != 0:
        raise AssertionError(
            f"{script} failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
            f"{result.stderr[-6000:]}"
        )
    return result


def run_recipe(script, env=None, check=True, cwd=None, args=()):
    """Run a recipe's entry script (bash, see recipe_env) with ``args`` (e.g.
    --help); returns the CompletedProcess."""
    result = subprocess.run(
        ["bash", str(script), *args],
        cwd=cwd or REPO,
        env=recipe_env(env),
        capture_output=True,
        text=True,
        timeout=900,
    )
    return _checked(script, result, check)


def start_recipe(script, env, cwd, output_dir):
    """Start a recipe in the background (see recipe_env), its stdout and
    stderr going to files in output_dir; wait_recipe collects it."""
    out = open(Path(output_dir) / "recipe.stdout", "w")
    err = open(Path(output_dir) / "recipe.stderr", "w")
    with out, err:
        proc = subprocess.Popen(
            ["bash", str(script)], cwd=cwd, env=recipe_env(env), stdout=out, stderr=err, text=True
        )
    proc.script, proc.output_dir = script, Path(output_dir)
    return proc


def wait_recipe(proc, check=True, timeout=900):
    try:
        returncode = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    result = subprocess.CompletedProcess(
        proc.args,
        returncode,
        stdout=(proc.output_dir / "recipe.stdout").read_text(),
        stderr=(proc.output_dir / "recipe.stderr").read_text(),
    )
    return _checked(proc.script, result, check)


def epoch_batches(log_text):
    """Batches per epoch (per rank) from fairseq's simple progress lines
    ("epoch 001:     10 / 51 loss=...")."""
    sizes = {int(m) for m in re.findall(r"epoch \d+:\s+\d+ / (\d+)", log_text)}
    if len(sizes) != 1:
        raise AssertionError(f"expected one epoch size in the log, found {sizes}")
    return sizes.pop()


# --- half precision on the CPU, at float32 matrix-product speed ---------------------


def half_matmuls_in_float32():
    """A context in which every fp16 or bfloat16 matrix product (aten mm,
    addmm, bmm, baddbmm: nn.Linear and attention, forward and backward) is
    computed in float32 and rounded to its half type once, which is what the
    CPU's own half kernels compute (float32 accumulation, one rounding at the
    end; the two differ only in summation order, a last bit here and there)
    at a twentieth of their speed on a CPU without native half arithmetic.
    Everything else stays in half precision as it was: the casts, each
    product's half inputs and half output (a product beyond 65,504 is inf
    all the same), every other op, fairseq's optimisers and loss scaler.
    For the tests that drive fp16/bf16 training at real-text sizes; the small
    half-precision tests keep the real kernels."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    products = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
    halves = {torch.float16, torch.bfloat16}

    class HalfMatmulsInFloat32(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in products:
                dtypes = {a.dtype for a in args if isinstance(a, torch.Tensor)}
                if len(dtypes) == 1 and dtypes <= halves:
                    (dtype,) = dtypes
                    wide = [a.float() if isinstance(a, torch.Tensor) else a for a in args]
                    return func(*wide, **kwargs).to(dtype)
            return func(*args, **kwargs)

    return HalfMatmulsInFloat32()


def ranked_thirds(pairs):
    """seed 003's App. E ranking, written apart from natbias.tools.frequency_bias:
    the kept pairs (``p["kept"]``) sorted by ``p["relative"]`` (ties in their
    order), then the lower and the upper third (``n // 3`` pairs each)."""
    kept = [p for p in pairs if p["kept"]]
    order = sorted(range(len(kept)), key=lambda i: kept[i]["relative"])  # stable
    third = len(kept) // 3
    lower, upper = [kept[i] for i in order[:third]], [kept[i] for i in order[len(kept) - third :]]
    return kept, lower, upper
