"""examples/: every example run end to end through its own script, on tiny
settings (Multi30k's first 2,000 pairs, SentencePiece 1000, d 32, one layer,
20 updates, 100 validation and test sentences), asserting on what it writes
and prints, each output checked against a computation of its own; and per
example one bad input: one line saying what is wrong, a non-zero exit, no
traceback. The translation example's work folder is shared by the examples
built on it (python_api, external_bias, frequency_analysis).

Without DATA the examples find their data as `make demo` does
(examples/paper/multi30k.py): tested here without Multi30k, from a copy of
examples/ with NATBIAS_MULTI30K unset and no network (a file:// address
stands in for Multi30k's; the synthetic fallback when it fails)."""

import csv
import gzip
import os
import re
import shutil
import subprocess
from collections import Counter

import pytest
import torch
from natbias_testing import (
    MULTI30K,
    REPO,
    sacrebleu_scores,
    script_path,
    script_python,
    skip_without_data,
)

EXAMPLES = REPO / "examples"
SCRIPTS = {
    "translation": EXAMPLES / "translation/run.sh",
    "external_bias": EXAMPLES / "external_bias/run.sh",
    "frequency_analysis": EXAMPLES / "frequency_analysis/run.sh",
    "language_model": EXAMPLES / "language_model/run.sh",
}
DECOMPOSE = EXAMPLES / "python_api/decompose.py"
TRAIN_LINES, EVAL_LINES = 2000, 100
TINY = {  # the settings shared by the translation, external-bias and LM examples
    "TRAIN_LINES": TRAIN_LINES,
    "EVAL_LINES": EVAL_LINES,
    "VOCAB": 1000,
    "EMBED_DIM": 32,
    "FFN_DIM": 64,
    "HEADS": 2,
    "LAYERS": 1,
    "MAX_UPDATE": 20,
    "MAX_TOKENS": 2000,
    "WARMUP": 10,
}
DEFAULT_CRITERION = "unigram_label_smoothed_cross_entropy"  # the examples' CRITERION
PAPERS_CRITERION = "label_smoothed_cross_entropy"
SCORE_LINE = re.compile(
    r"^\[(\w+)\] (BLEU|chrF2)\|nrefs:1\|case:mixed\|.*\|version:[\d.]+ = ([\d.]+)"
)


def example_settings():
    """Every NAME=${NAME-...} an example script reads: none may leak in from
    the caller's shell (a WORK or DATA set there would redirect the tests)."""
    names = set()
    for script in SCRIPTS.values():
        names.update(re.findall(r"^([A-Z][A-Z0-9_]*)=\$\{", script.read_text(), re.M))
    return names | {"WORK"}


def run_example(command, env=None, cwd=None, unset=()):
    clean = {k: v for k, v in os.environ.items() if k not in example_settings() and k not in unset}
    clean.update(PATH=script_path(), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    clean.update({k: str(v) for k, v in (env or {}).items()})
    return subprocess.run(
        [str(c) for c in command],
        env=clean,
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


def succeeded(result):
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


def assert_one_line_error(result, script_name, *fragments):
    """Bad input: non-zero exit, no traceback, the last stderr line names the
    script and what is wrong."""
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{script_name}: error: "), result.stderr
    for fragment in fragments:
        assert fragment in last, last


def multi30k_lines(name, lang, n):
    with gzip.open(MULTI30K / f"{name}.{lang}.gz", "rt", encoding="utf-8") as lines:
        return [line.rstrip("\n") for _, line in zip(range(n), lines)]


@pytest.fixture(scope="module")
def multi30k():
    if not (MULTI30K / "train.de.gz").exists():
        skip_without_data(f"Multi30k not found at {MULTI30K} (set NATBIAS_MULTI30K)")
    return MULTI30K


@pytest.fixture(scope="module")
def translation(multi30k, tmp_path_factory):
    """examples/translation/run.sh on tiny settings: (its result, its WORK)."""
    work = tmp_path_factory.mktemp("examples") / "translation"
    env = {**TINY, "DATA": multi30k, "WORK": work}
    return succeeded(run_example(["bash", SCRIPTS["translation"]], env)), work, env


# --- translation --------------------------------------------------------------------------


@pytest.mark.training
def test_translation_trains_both_biases_translates_and_scores(translation):
    from fairseq_natbias.checkpoints import saved_model_args

    result, work, _ = translation
    staged = (work / "raw/train.de").read_text().splitlines()
    assert staged == multi30k_lines("train", "de", TRAIN_LINES)
    references = (work / "raw/test.en").read_text().splitlines()
    assert references == multi30k_lines("test_2016_flickr", "en", EVAL_LINES)
    # --joined-dictionary: one dictionary for both sides
    data_bin = work / "data-bin"
    assert (data_bin / "dict.de.txt").read_text() == (data_bin / "dict.en.txt").read_text()
    scores = {}
    for line in result.stdout.splitlines():
        match = SCORE_LINE.match(line)
        if match:
            scores[match[1], match[2]] = float(match[3])
    assert set(scores) == {(i, m) for i in ("unigram", "zero") for m in ("BLEU", "chrF2")}
    for init in ("unigram", "zero"):
        run = work / "runs" / init
        assert saved_model_args(run / "checkpoint_best.pt").natbias_init == init
        hypotheses = (run / "test.hyp").read_text().splitlines()
        assert hypotheses == generated_in_id_order(run / "test.gen")
        assert len(hypotheses) == EVAL_LINES
        bleu, chrf = sacrebleu_scores(hypotheses, references)
        assert scores[init, "BLEU"] == pytest.approx(bleu, abs=0.051)  # printed to one decimal
        assert scores[init, "chrF2"] == pytest.approx(chrf, abs=0.051)


def generated_in_id_order(generate_output):
    """fairseq-generate's D-<id> lines (printed in length order), by id."""
    by_id = {}
    for line in generate_output.read_text().splitlines():
        if line.startswith("D-"):
            index, _, text = line[2:].split("\t")
            by_id[int(index)] = text
    assert sorted(by_id) == list(range(len(by_id)))
    return [by_id[i] for i in range(len(by_id))]


@pytest.mark.training
def test_translation_run_again_skips_every_step(translation):
    result, work, env = translation
    again = succeeded(run_example(["bash", SCRIPTS["translation"]], env))
    skipped = [line for line in again.stderr.splitlines() if "skipped" in line]
    assert len(skipped) == 3 + 2 * 2  # text, sentencepiece, preprocess; train, generate x 2
    assert [line for line in again.stdout.splitlines() if SCORE_LINE.match(line)] == [
        line for line in result.stdout.splitlines() if SCORE_LINE.match(line)
    ]


@pytest.mark.training
def test_translation_criterion_default_and_refusal(translation):
    """The default run trains with unigram label smoothing (the checkpoint's
    own config says so); a WORK trained under another criterion is refused
    with the CRITERION that keeps it rather than compared unnoticed. That
    CRITERION reaches fairseq-train, and an empty train.done (from before
    CRITERION existed) is refused too: the fresh-clone test below, which
    trains under the paper's criterion."""
    _, work, env = translation
    trained = torch.load(
        work / "runs/unigram/checkpoint_best.pt", map_location="cpu", weights_only=False
    )
    assert trained["cfg"]["criterion"]["_name"] == DEFAULT_CRITERION
    assert (work / "runs/unigram/train.done").read_text().strip() == DEFAULT_CRITERION
    refused = run_example(["bash", SCRIPTS["translation"]], {**env, "CRITERION": PAPERS_CRITERION})
    assert_one_line_error(
        refused,
        "examples/translation/run.sh",
        f"{work}/runs/unigram was trained with --criterion {DEFAULT_CRITERION}, "
        f"not CRITERION={PAPERS_CRITERION}: give CRITERION={DEFAULT_CRITERION} "
        "to keep using it",
    )


def test_translation_bad_data_folder(tmp_path):
    result = run_example(
        ["bash", SCRIPTS["translation"]], {"DATA": tmp_path, "WORK": tmp_path / "w"}
    )
    assert_one_line_error(result, "examples/translation/run.sh", f"DATA={tmp_path} has no train.de")
    assert not (tmp_path / "w/raw").exists()


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_script_lists_its_settings_with_help(name):
    result = succeeded(run_example(["bash", SCRIPTS[name], "--help"]))
    settings = re.findall(r"^([A-Z][A-Z0-9_]*)=\$\{", SCRIPTS[name].read_text(), re.M)
    assert settings and all(f"\n{setting}=" in result.stdout for setting in settings)
    for line in SCRIPTS[name].read_text().splitlines():
        if re.match(r"[A-Z][A-Z0-9_]*=\$\{", line):
            assert "  # " in line, f"{name}: a setting without a comment: {line}"


# --- python_api ---------------------------------------------------------------------------


TABLE_ROW = re.compile(r"^\s*\d+\s+\S+((?:\s+-?\d+\.\d{4}){4})$")


@pytest.mark.training
def test_decompose_prints_the_identity_per_token(translation):
    _, work, _ = translation
    result = succeeded(run_example([script_python(), DECOMPOSE], {"WORK": work}))
    rows = [
        [float(v) for v in m[1].split()]
        for m in map(TABLE_ROW.match, result.stdout.splitlines())
        if m
    ]
    assert rows  # at least the EOS row
    for log_p, context, frequency, normaliser in rows:
        # printed to 4 decimals: the sum of three rounded terms is within 2e-4
        assert log_p == pytest.approx(context + frequency + normaliser, abs=3e-4)
        assert normaliser >= 0
    residual = float(
        re.search(
            r"largest \|log p - \(context \+ frequency \+ normaliser\)\|: (\S+)", result.stdout
        )[1]
    )
    assert residual < 1e-5
    beam, teacher_forced = map(
        float,
        re.search(
            r"beam search's own log p of the translation: (\S+) \(teacher-forced above: (\S+)\)",
            result.stdout,
        ).groups(),
    )
    assert beam == pytest.approx(teacher_forced, abs=1e-3)
    assert teacher_forced == pytest.approx(sum(row[0] for row in rows), abs=1e-3 * len(rows))
    assert "--natbias-init unigram, gain g = " in result.stdout


@pytest.mark.training
def test_decompose_a_reference_with_the_zero_model(translation):
    _, work, _ = translation
    reference = multi30k_lines("test_2016_flickr", "en", 1)[0]
    source = multi30k_lines("test_2016_flickr", "de", 1)[0]
    result = succeeded(
        run_example(
            [
                script_python(),
                DECOMPOSE,
                "--checkpoint",
                work / "runs/zero/checkpoint_best.pt",
                "--sentence",
                source,
                "--reference",
                reference,
            ],
            {"WORK": work},
        )
    )
    assert f"reference (teacher-forced): {reference}" in result.stdout
    rows = [m for m in map(TABLE_ROW.match, result.stdout.splitlines()) if m]
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(work / "spm.model"))
    pieces = processor.encode(reference)
    assert len(rows) == len(pieces) + 1  # and EOS


def test_decompose_missing_checkpoint(tmp_path):
    result = run_example([script_python(), DECOMPOSE, "--checkpoint", tmp_path / "none.pt"])
    assert_one_line_error(result, "decompose.py", "no such checkpoint")


# --- external_bias ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def external(translation):
    _, translation_work, env = translation
    work = translation_work.parent / "external_bias"
    env = {
        **env,
        "TRANSLATION_WORK": translation_work,
        "WORK": work,
        "EXTERNAL_TEXT": MULTI30K / "train.en.gz",
    }
    return succeeded(run_example(["bash", SCRIPTS["external_bias"]], env)), work, translation_work


@pytest.mark.training
def test_external_bias_counts_the_external_text_and_trains_with_it(external):
    from fairseq.data import Dictionary

    from fairseq_natbias.checkpoints import saved_model_args

    result, work, translation_work = external
    dictionary = Dictionary.load(str(translation_work / "data-bin/dict.en.txt"))
    expected = Counter()
    lines = (work / "spm/external.en").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 29000  # all of Multi30k's English training text
    for line in lines:
        expected.update(dictionary[dictionary.index(piece)] for piece in line.split())
        expected["</s>"] += 1
    written = (work / "external.counts").read_text(encoding="utf-8").splitlines()
    assert written[0] == "#natbias-counts v1"
    counts = {symbol: int(n) for symbol, n in (line.rsplit("\t", 1) for line in written[1:])}
    assert len(counts) == len(dictionary)
    assert {s: n for s, n in counts.items() if n} == dict(expected)
    saved = saved_model_args(work / "runs/file/checkpoint_best.pt")
    assert saved.natbias_init == "file" and saved.natbias_counts == str(work / "external.counts")
    inits = {m[1] for m in map(SCORE_LINE.match, result.stdout.splitlines()) if m}
    assert inits == {"file", "unigram", "zero"}


@pytest.mark.training
def test_external_bias_missing_text(translation, tmp_path):
    _, translation_work, _ = translation
    result = run_example(
        ["bash", SCRIPTS["external_bias"]],
        {
            "TRANSLATION_WORK": translation_work,
            "WORK": tmp_path,
            "EXTERNAL_TEXT": tmp_path / "no.txt",
        },
    )
    assert_one_line_error(result, "examples/external_bias/run.sh", "no such file", "EXTERNAL_TEXT")


@pytest.mark.training
def test_external_bias_refuses_translation_runs_of_another_criterion(translation, tmp_path):
    """Its scores are printed beside the translation runs': not under mixed criteria."""
    _, translation_work, _ = translation
    papers = "label_smoothed_cross_entropy"
    result = run_example(
        ["bash", SCRIPTS["external_bias"]],
        {
            "TRANSLATION_WORK": translation_work,
            "WORK": tmp_path,
            "CRITERION": papers,
            "EXTERNAL_TEXT": MULTI30K / "train.en.gz",
        },
    )
    assert_one_line_error(
        result,
        "examples/external_bias/run.sh",
        f"{translation_work}/runs/",
        "was trained with --criterion "
        f"unigram_label_smoothed_cross_entropy, not CRITERION={papers}",
    )
    assert not (tmp_path / "runs").exists()


# --- frequency_analysis ------------------------------------------------------------------


@pytest.mark.training
def test_frequency_analysis_draws_fig_4(translation):
    _, translation_work, _ = translation
    out = translation_work.parent / "frequency_analysis"
    result = succeeded(
        run_example(
            ["bash", SCRIPTS["frequency_analysis"]],
            {"TRANSLATION_WORK": translation_work, "OUT": out},
        )
    )
    assert (out / "frequency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader((out / "frequency_bins.csv").open(encoding="utf-8")))
    by_model = {m: [r for r in rows if r["model"] == m] for m in ("zero", "unigram")}
    printed = [
        line.split()
        for line in result.stdout.splitlines()
        if re.match(r"^\s*-?\d+\.\d\d(\s+-?\d+\.\d{3}){4}$", line)
    ]
    assert len(printed) == len(by_model["unigram"]) == len(by_model["zero"]) > 10
    for cells, zero, unigram in zip(printed, by_model["zero"], by_model["unigram"]):
        assert float(cells[0]) == pytest.approx(float(zero["bin_center"]), abs=0.005)
        assert float(cells[3]) == pytest.approx(float(unigram["mean_logprob_full"]), abs=5e-4)
    # Fig. 4, right column, after 20 updates: with all parameters the unigram
    # model's log-probability rises with frequency about one for one; with
    # the bias dropped, much less.
    full = slope(by_model["unigram"], "mean_logprob_full")
    dropped = slope(by_model["unigram"], "mean_logprob_without_bias")
    assert full > 0.5 and abs(dropped) < 0.5 * full


def slope(rows, column):
    x = torch.tensor([float(r["mean_log_unigram"]) for r in rows], dtype=torch.float64)
    y = torch.tensor([float(r[column]) for r in rows], dtype=torch.float64)
    x = x - x.mean()
    return float((x * (y - y.mean())).sum() / (x * x).sum())


@pytest.mark.training
def test_frequency_analysis_refuses_a_file_that_is_not_a_checkpoint(translation, tmp_path):
    _, translation_work, _ = translation
    not_a_checkpoint = translation_work / "data-bin/dict.en.txt"
    result = run_example(
        ["bash", SCRIPTS["frequency_analysis"]],
        {
            "TRANSLATION_WORK": translation_work,
            "OUT": tmp_path,
            "MODELS": f"zero={not_a_checkpoint}",
        },
    )
    assert_one_line_error(
        result, "examples/frequency_analysis/run.sh", "is not a fairseq checkpoint"
    )


# --- language_model -----------------------------------------------------------------------


LAMBDAS = ("1", "0.5", "0")


@pytest.fixture(scope="module")
def language_model(multi30k, tmp_path_factory):
    work = tmp_path_factory.mktemp("examples") / "language_model"
    env = {
        **TINY,
        "DATA": multi30k,
        "WORK": work,
        "INITS": "unigram",
        "LAMBDAS": " ".join(LAMBDAS),
        "PROMPT": "A man",
    }
    return succeeded(run_example(["bash", SCRIPTS["language_model"]], env)), work


@pytest.mark.training
def test_language_model_evaluates_samples_and_sweeps(language_model):
    result, work = language_model
    loss, perplexity = map(
        float,
        re.search(
            r"^\[unigram\] Loss \(base 2\): ([\d.]+), Perplexity: ([\d.]+)$", result.stdout, re.M
        ).groups(),
    )
    assert perplexity == pytest.approx(2**loss, rel=1e-3)
    tokens = sum(len(line.split()) + 1 for line in (work / "spm/test.en").read_text().splitlines())
    assert f"Evaluated {tokens:,} tokens" in (work / "runs/unigram/eval_lm.log").read_text()
    samples = [
        line.split("\t")
        for line in result.stdout.splitlines()
        if line.startswith("[unigram] lambda=")
    ]
    assert [s[0] for s in samples] == [
        f"[unigram] lambda={lam}" for lam in LAMBDAS for _ in range(3)
    ]
    assert all(text.startswith("A man") for _, text in samples)
    table = [
        line.strip("|").split("|")
        for line in result.stdout.splitlines()
        if re.match(r"^\| [\d.]+ \| [\d.]+ \|", line)
    ]
    assert [row[0].strip() for row in table] == list(LAMBDAS)
    # Two independent computations of the test NLL with the bias as trained:
    # fairseq-eval-lm's and the sweep's lambda = 1 row.
    assert float(table[0][2]) == pytest.approx(loss, abs=2e-3)
    assert (work / "runs/unigram/sweep/sweep_lm.png").exists()


def test_language_model_bad_data_folder(tmp_path):
    (tmp_path / "train.en").write_text("a b\n")
    result = run_example(
        ["bash", SCRIPTS["language_model"]], {"DATA": tmp_path, "WORK": tmp_path / "w"}
    )
    assert_one_line_error(
        result, "examples/language_model/run.sh", f"DATA={tmp_path} has no val.en"
    )


@pytest.mark.training
def test_sampling_refuses_a_translation_checkpoint(translation, language_model):
    _, translation_work, _ = translation
    _, work = language_model
    result = run_example(
        [
            script_python(),
            EXAMPLES / "language_model/sample.py",
            "--checkpoint",
            translation_work / "runs/zero/checkpoint_best.pt",
            "--data-bin",
            work / "data-bin",
            "--spm-model",
            work / "spm.model",
        ]
    )
    assert_one_line_error(result, "sample.py", "is a translation model")


# --- data found as `make demo` finds it, on a fresh clone ------------------------------


FRESH = {**TINY, "INITS": "unigram", "MAX_UPDATE": 2}


def fresh_clone(tmp_path):
    """examples/ alone in a folder with no ../shared beside it: the installed
    package serves --user-dir fairseq_natbias and the data helper."""
    clone = tmp_path / "clone"
    shutil.copytree(EXAMPLES, clone / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    return clone


@pytest.mark.training
def test_translation_on_a_fresh_clone_falls_back_to_the_synthetic_corpus(tmp_path):
    """Also the run under another CRITERION (the paper's): it reaches
    fairseq-train (the checkpoint's config) and train.done; an empty
    train.done, as the examples wrote it before CRITERION, is refused under
    the default CRITERION with the one that keeps the run."""
    clone = fresh_clone(tmp_path)
    assert not (clone.parent / "shared").exists() and not (clone / "fairseq_natbias").exists()
    env = {
        **FRESH,
        "NATBIAS_MULTI30K_URL": (tmp_path / "offline").as_uri(),
        "CRITERION": PAPERS_CRITERION,
    }
    result = succeeded(
        run_example(
            ["bash", "examples/translation/run.sh"], env, cwd=clone, unset=("NATBIAS_MULTI30K",)
        )
    )
    assert "download failed" in result.stderr
    assert "using a small SYNTHETIC corpus" in result.stderr
    # DATA_CACHE and WORK: the defaults, relative to where the script ran
    synthetic = clone / "work/examples/data/synthetic"
    staged = clone / "work/examples/translation/raw"
    for name, split, lines in (
        ("train", "train", TRAIN_LINES),
        ("val", "valid", EVAL_LINES),
        ("test_2016_flickr", "test", EVAL_LINES),
    ):
        for lang in ("de", "en"):
            expected = (synthetic / f"{name}.{lang}").read_text().splitlines()[:lines]
            assert (staged / f"{split}.{lang}").read_text().splitlines() == expected
    scores = [m[1] for m in map(SCORE_LINE.match, result.stdout.splitlines()) if m]
    assert scores == ["unigram", "unigram"]  # BLEU and chrF
    run = clone / "work/examples/translation/runs/unigram"
    saved = torch.load(run / "checkpoint_best.pt", map_location="cpu", weights_only=False)
    assert saved["cfg"]["criterion"]["_name"] == PAPERS_CRITERION
    assert (run / "train.done").read_text().strip() == PAPERS_CRITERION
    again = succeeded(
        run_example(
            ["bash", "examples/translation/run.sh"], env, cwd=clone, unset=("NATBIAS_MULTI30K",)
        )
    )
    # staged before: the data is not looked for (or downloaded) again
    assert (
        "data:" not in again.stderr
        and "raw text: work/examples/translation/raw exists, skipped" in again.stderr
    )
    (run / "train.done").write_text("")
    old = run_example(
        ["bash", "examples/translation/run.sh"],
        {key: value for key, value in env.items() if key != "CRITERION"},
        cwd=clone,
        unset=("NATBIAS_MULTI30K",),
    )
    assert_one_line_error(
        old,
        "examples/translation/run.sh",
        f"work/examples/translation/runs/unigram was trained with --criterion "
        f"{PAPERS_CRITERION}, not CRITERION={DEFAULT_CRITERION}: "
        f"give CRITERION={PAPERS_CRITERION} to keep using it",
    )


def test_data_is_a_file(tmp_path):
    data = tmp_path / "train.de"
    data.write_text("ein Hund\n")
    result = run_example(["bash", SCRIPTS["translation"]], {"DATA": data, "WORK": tmp_path / "w"})
    assert_one_line_error(
        result, "examples/translation/run.sh", f"DATA={data} is a file, not a folder"
    )
    assert not (tmp_path / "w/raw").exists()


def test_natbias_multi30k_without_the_files(tmp_path):
    """A data variable set by hand and wrong is refused, not silently replaced
    by a download."""
    (tmp_path / "m30k").mkdir()
    (tmp_path / "m30k/train.en.gz").write_bytes(b"")
    result = run_example(
        ["bash", SCRIPTS["language_model"]],
        {
            "NATBIAS_MULTI30K": tmp_path / "m30k",
            "WORK": tmp_path / "w",
            "DATA_CACHE": tmp_path / "cache",
        },
    )
    assert_one_line_error(
        result,
        "examples/language_model/run.sh",
        f"NATBIAS_MULTI30K={tmp_path / 'm30k'} has no val.en, test_2016_flickr.en",
    )
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("name", ["external_bias", "frequency_analysis"])
def test_run_before_the_translation_example(name, tmp_path):
    result = run_example(
        ["bash", SCRIPTS[name]],
        {"TRANSLATION_WORK": tmp_path / "nothing", "WORK": tmp_path / "w", "OUT": tmp_path / "o"},
    )
    assert_one_line_error(
        result, f"examples/{name}/run.sh", "run examples/translation/run.sh first"
    )


def test_decompose_before_the_translation_example(tmp_path):
    result = run_example([script_python(), DECOMPOSE], {"WORK": tmp_path})
    assert_one_line_error(
        result, "decompose.py", "no such checkpoint", "run examples/translation/run.sh first"
    )
