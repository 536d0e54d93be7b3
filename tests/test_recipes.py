"""The recipes (recipes/*/run.sh) end to end in smoke mode (SMOKE=1): real
Multi30k text, tiny models, a few updates, on CPU, through the real entry
scripts. One smoke run per recipe is shared by the tests that read it."""

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from natbias_testing import (
    BIN,
    MULTI30K,
    MULTI30K_RAW,
    RECIPES,
    epoch_batches,
    multi30k_has,
    recipe_env,
    recipe_settings,
    run_recipe,
    setting_lines,
    skip_without_data,
    start_recipe,
    wait_recipe,
)

# The IWSLT smoke run trains the natural bias with one seed. The recipe's
# other default inits, zero and none, run the same steps with another
# --natbias-init (each trained and generated end to end in
# tests/test_transformer_natbias.py, zero through the translation example),
# and its second smoke seed the same steps with another --seed: left out here
# because every run is two fairseq processes of the suite's slowest fixture.
# The table's mean ± s.e. over seeds is checked on hand-made scores instead
# (test_table_averages_seeds_with_their_standard_error).
INITS = ("unigram",)
SEEDS = (1,)
IWSLT = RECIPES / "iwslt14_de_en" / "run.sh"
RECIPE_SCRIPTS = [
    RECIPES / name / "run.sh"
    for name in ("iwslt14_de_en", "wmt14_de_en", "afromt", "multilingual", "template")
]
MULTILINGUAL = RECIPES / "multilingual" / "run.sh"
DEFAULTS = RECIPES / "defaults.sh"
# The template's "set these three" lines: blanks for the user to fill in, empty
# like their defaults on purpose.
TEMPLATE_BLANKS = {"SRC", "TGT", "RAW_DIR"}


def skip_without(*langs):
    if not multi30k_has(*langs):
        skip_without_data(
            f"Multi30k {'/'.join(langs)} not found at {MULTI30K} (set NATBIAS_MULTI30K)"
        )


def run_dirs(runs, seeds):
    return [runs / init / f"seed{seed}" for init in INITS for seed in seeds]


def table_rows(results_md):
    rows = {}
    for line in results_md.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and cells[0] in INITS:
            rows[cells[0]] = cells[1:]
    return rows


# --- shared smoke runs ----------------------------------------------------------


def start_iwslt(root):
    """recipes/iwslt14_de_en/run.sh, SMOKE=1, on Multi30k De-En: the unigram
    bias, seed 1, scored on test_2016_flickr."""
    env = dict(
        MULTI30K_RAW,
        PAIRS="de-en",
        OOD_TEST="",
        WORK_DIR=root / "work",
        INITS=" ".join(INITS),
        SEEDS=" ".join(map(str, SEEDS)),
    )
    pair = root / "work" / "de-en"
    return SimpleNamespace(
        proc=start_recipe(IWSLT, env, root, root), env=env, root=root, pair=pair, runs=pair / "runs"
    )


def start_template(root):
    """recipes/template copied out of the repository and set up for Multi30k
    Fr-En by editing its settings and adding lines for others of defaults.sh,
    as a user would; one seed of the unigram bias (the three-init grid is the
    IWSLT smoke run's), with test_2017_flickr as the out-of-domain test."""
    shutil.copytree(RECIPES / "template", root / "fr_en")
    script = root / "fr_en" / "run.sh"
    text = script.read_text(encoding="utf-8")
    for name, value in (("SRC", "fr"), ("TGT", "en"), ("RAW_DIR", MULTI30K)):
        text, n = re.subn(
            rf"^{name}=\$\{{{name}-[^}}]*\}}", f"{name}=${{{name}-{value}}}", text, flags=re.M
        )
        assert n == 1, name
    added = ""
    for name, value in (
        ("RAW_VALID", "val"),
        ("RAW_TEST", "test_2016_flickr"),
        ("OOD_TEST", MULTI30K / "test_2017_flickr"),
    ):
        assert not re.search(rf"^{name}=", text, flags=re.M), name
        added += f"{name}=${{{name}-{value}}}\n"
    text, n = re.subn(r"^(RAW_DIR=.*\n)", lambda m: m[1] + added, text, flags=re.M)
    assert n == 1
    script.write_text(text, encoding="utf-8")
    # The copy lives outside the repository: it is told where lib.sh is.
    env = {"RECIPES_DIR": RECIPES, "SEEDS": "1", "INITS": "unigram"}
    pair = root / "work" / "fr_en" / "fr-en"
    return SimpleNamespace(
        proc=start_recipe(script, env, root, root), root=root, pair=pair, runs=pair / "runs"
    )


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory):
    """Both smoke runs start at once (they share nothing and the box has two
    cores); the fixtures below each wait for their own."""
    runs = {}
    if multi30k_has("de", "en"):
        runs["iwslt"] = start_iwslt(tmp_path_factory.mktemp("iwslt"))
    if multi30k_has("fr", "en"):
        runs["template"] = start_template(tmp_path_factory.mktemp("template"))
    yield runs
    for run in runs.values():
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()


def finished(smoke_runs, name, *langs):
    skip_without(*langs)
    run = smoke_runs[name]
    if not hasattr(run, "output"):
        result = wait_recipe(run.proc)
        run.output = result.stderr + result.stdout
    return run


@pytest.fixture(scope="module")
def iwslt(smoke_runs):
    return finished(smoke_runs, "iwslt", "de", "en")


@pytest.fixture(scope="module")
def template(smoke_runs):
    return finished(smoke_runs, "template", "fr", "en")


# --- IWSLT recipe on Multi30k De-En ---------------------------------------------


@pytest.mark.training
def test_iwslt_trains_and_scores_every_run(iwslt):
    reference = (iwslt.root / "work/corpus/de-en/raw/test.en").read_text(encoding="utf-8")
    for run in run_dirs(iwslt.runs, SEEDS):
        for name in ("checkpoint_best.pt", "checkpoint_last.pt", "train.log", "test.hyp"):
            assert (run / name).is_file(), run / name
        assert "done training" in (run / "train.log").read_text(encoding="utf-8")
        hyps = (run / "test.hyp").read_text(encoding="utf-8").splitlines()
        assert len(hyps) == len(reference.splitlines()) == 50
        assert not any("\u2581" in h for h in hyps), "hypotheses are not detokenised"
        bleu = json.loads((run / "test.bleu.json").read_text(encoding="utf-8"))
        chrf = json.loads((run / "test.chrf.json").read_text(encoding="utf-8"))
        assert bleu["name"] == "BLEU" and bleu["signature"].startswith("nrefs:1|case:mixed")
        assert chrf["name"].startswith("chrF") and "nc:6" in chrf["signature"]
        assert not (run / "ood.bleu.json").exists()  # OOD_TEST is empty here


@pytest.mark.training
def test_iwslt_runs_with_the_papers_settings(iwslt):
    for init in INITS:
        log = (iwslt.runs / init / "seed1" / "train.log").read_text(encoding="utf-8")
        config = next(line for line in log.splitlines() if "'optimization':" in line)
        for setting in (
            f"natbias_init='{init}'",
            "'adam_betas': '(0.9, 0.997)'",
            ", dropout=0.1,",
            "'label_smoothing': 0.1",
            "'_name': 'label_smoothed_cross_entropy'",
            "'eval_bleu': True",
            "'eval_bleu_remove_bpe': 'sentencepiece'",
            "'best_checkpoint_metric': 'bleu'",
            "'maximize_best_checkpoint_metric': True",
            "'patience': 10",
            "share_all_embeddings=True",
            "'seed': 1",
        ):
            assert setting in config, setting
        assert re.search(r"'eval_bleu_args': '\{\"beam\": 5", config)
        assert re.search(r"\| valid \|.*\| bleu [\d.]+", log), "no validation BLEU"


@pytest.mark.training
def test_iwslt_table_has_every_init_with_signatures(iwslt):
    results = iwslt.pair / "results.md"
    rows = table_rows(results)
    assert set(rows) == set(INITS)
    for init, cells in rows.items():
        assert cells[0] == str(len(SEEDS)), (init, cells)
        run = iwslt.runs / init / "seed1"
        for cell, metric in zip(cells[1:3], ("bleu", "chrf")):  # one seed: its score
            score = json.loads((run / f"test.{metric}.json").read_text(encoding="utf-8"))["score"]
            assert cell == f"{score:.2f}", (init, metric, cells)
    text = results.read_text(encoding="utf-8")
    assert re.search(
        r"BLEU signature: `nrefs:1\|case:mixed\|eff:no\|tok:13a\|smooth:exp\|version:2", text
    )
    assert re.search(r"chrF signature: `nrefs:1\|case:mixed\|eff:yes\|nc:6\|nw:0", text)
    assert "| unigram |" in iwslt.output  # the table is printed at the end too


@pytest.mark.training
def test_table_averages_seeds_with_their_standard_error(iwslt, tmp_path):
    """The recipe's table step (natbias_tools.py table, as report() calls it)
    over two seeds of the smoke run's real sacreBLEU files, their scores set
    by hand: BLEU 30.0 and 31.0 give 30.50 ± 0.50 (s = 0.7071, s / sqrt(2)),
    chrF 50.0 and 52.5 give 51.25 ± 1.25; a seed not scored yet counts for
    nothing."""
    source = iwslt.runs / "unigram" / "seed1"
    for seed, bleu, chrf in ((1, 30.0, 50.0), (2, 31.0, 52.5)):
        run = tmp_path / "runs" / "unigram" / f"seed{seed}"
        run.mkdir(parents=True)
        for metric, value in (("bleu", bleu), ("chrf", chrf)):
            result = json.loads((source / f"test.{metric}.json").read_text(encoding="utf-8"))
            result["score"] = value
            (run / f"test.{metric}.json").write_text(json.dumps(result), encoding="utf-8")
    (tmp_path / "runs" / "unigram" / "seed3").mkdir()  # started, not scored
    output = tmp_path / "results.md"
    subprocess.run(
        [
            sys.executable,
            RECIPES / "natbias_tools.py",
            "table",
            "--runs",
            tmp_path / "runs",
            "--output",
            output,
            "--title",
            "t",
            "--beam",
            "5",
            "--lenpen",
            "1",
            "--order",
            "unigram",
        ],
        check=True,
        capture_output=True,
    )
    assert table_rows(output)["unigram"] == ["2", "30.50 ± 0.50", "51.25 ± 1.25"]


@pytest.mark.training
def test_rerun_skips_finished_steps(iwslt):
    outputs = sorted(p for p in iwslt.runs.rglob("*") if p.is_file())
    before = {p: p.stat().st_mtime_ns for p in outputs if p.suffix in (".pt", ".json", ".hyp")}
    result = run_recipe(IWSLT, iwslt.env, cwd=iwslt.root)
    said = result.stderr
    for step in ("corpus/de-en/raw", "corpus/de-en/spm", "de-en/data-bin"):
        assert f"skip: {iwslt.root / 'work' / step} (done)" in said
    runs = len(INITS) * len(SEEDS)
    assert said.count("(trained)") == runs and said.count("(scored)") == runs
    assert "training de-en" not in said
    assert {p: p.stat().st_mtime_ns for p in before} == before


@pytest.mark.training
def test_changed_data_settings_are_refused(iwslt):
    result = run_recipe(
        IWSLT, dict(iwslt.env, STEPS="prepare", TRAIN_LINES="2000"), cwd=iwslt.root, check=False
    )
    assert result.returncode != 0
    assert "was made with other settings" in result.stderr


@pytest.mark.training
def test_stopped_run_resumes_from_checkpoint_last(iwslt):
    """A run without its done marker carries on from checkpoint_last.pt."""
    run = iwslt.pair / "runs-resume" / "unigram" / "seed1"
    run.mkdir(parents=True)
    for name in ("checkpoint_last.pt", "train.log"):
        shutil.copy(iwslt.runs / "unigram" / "seed1" / name, run / name)
    first = (run / "train.log").read_text(encoding="utf-8")
    result = run_recipe(
        IWSLT,
        dict(
            iwslt.env,
            STEPS="train",
            INITS="unigram",
            SEEDS="1",
            RUNS_NAME="runs-resume",
            MAX_UPDATE="31",
        ),
        cwd=iwslt.root,
    )
    assert "resuming de-en unigram seed 1" in result.stderr
    resumed = (run / "train.log").read_text(encoding="utf-8")[len(first) :]
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch 1 @ 30 updates\)", resumed)
    assert "num_updates 31" in resumed and "done training" in resumed
    assert "tokens counted" not in resumed  # the bias comes from the checkpoint
    assert (run / ".done").exists()


@pytest.mark.training
def test_two_cpu_processes_train_one_model(iwslt):
    """CPU_WORKERS=2: two fairseq-train ranks joined over gloo through the
    recipe's launcher, each taking half of the epoch's batches."""
    result = run_recipe(
        IWSLT,
        dict(
            iwslt.env,
            STEPS="train",
            CPU_WORKERS="2",
            INITS="unigram",
            SEEDS="1",
            RUNS_NAME="runs-gloo",
            MAX_UPDATE="4",
            LOG_INTERVAL="2",
            TOKENS_PER_UPDATE="2000",
        ),
        cwd=iwslt.root,
    )
    assert "on 2 CPU worker(s), update-freq 1" in result.stderr
    run = iwslt.pair / "runs-gloo" / "unigram" / "seed1"
    rank0 = (run / "train.log").read_text(encoding="utf-8")
    rank1 = (run / "train.rank1.log").read_text(encoding="utf-8")
    assert "'distributed_world_size': 2" in rank0
    assert "training on 2 devices" in rank0
    assert "distributed init (rank 0)" in rank0 and "gloo" in rank0
    assert "distributed init (rank 1)" in rank1 and re.search(
        r"initialized host \S+ as rank 1", rank1
    )
    assert "done training" in rank0 and (run / "checkpoint_last.pt").exists()
    # Same data and tokens per batch as the one-process smoke runs: fairseq
    # shards the epoch's batches over the ranks, so each gets half of them.
    single = (iwslt.runs / "unigram" / "seed1" / "train.log").read_text(encoding="utf-8")
    assert epoch_batches(rank0) == math.ceil(epoch_batches(single) / 2)


# --- the template, copied and set up for a new pair ------------------------------


@pytest.mark.training
def test_template_trains_a_new_pair(template):
    assert "fr-en" in template.output
    run = template.runs / "unigram" / "seed1"
    for name in ("checkpoint_best.pt", "train.log", "test.hyp", "ood.hyp"):
        assert (run / name).is_file(), run / name
    for eval_set in ("test", "ood"):
        for metric in ("bleu", "chrf"):
            result = json.loads((run / f"{eval_set}.{metric}.json").read_text(encoding="utf-8"))
            assert result["signature"].startswith("nrefs:1|case:mixed")
    assert "natbias_init=" in (run / "train.log").read_text(encoding="utf-8")
    rows = table_rows(template.pair / "results.md")
    assert set(rows) == {"unigram"}
    header = next(
        line
        for line in (template.pair / "results.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("| init")
    )
    assert "ood BLEU" in header and "ood chrF" in header
    for cells in rows.values():
        assert cells[0] == "1" and all(re.fullmatch(r"\d+\.\d\d", c) for c in cells[1:5]), cells


def test_template_needs_its_pair_and_data(tmp_path):
    result = run_recipe(
        RECIPES / "template" / "run.sh",
        {"SRC": "", "TGT": "", "RAW_DIR": ""},
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode != 0
    assert "set SRC, TGT and RAW_DIR" in result.stderr


# --- one model over several pairs (recipes/multilingual) on Multi30k ----------------

ML_PAIRS = ("en-de", "en-fr")


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory):
    """recipes/multilingual/run.sh, SMOKE=1, on Multi30k: En->De and En->Fr as
    one model, the natural bias (its default prior, one per target language)
    and stock fairseq, seed 1; 1,000 pairs a direction, 10 updates, each
    direction scored on 20 test sentences."""
    skip_without("de", "en", "fr")
    root = tmp_path_factory.mktemp("multilingual")
    env = dict(
        MULTI30K_RAW,
        PAIRS=" ".join(ML_PAIRS),
        WORK_DIR=root / "work",
        SEEDS="1",
        TRAIN_LINES="1000",
        EVAL_LINES="20",
        MAX_UPDATE="10",
    )
    result = run_recipe(MULTILINGUAL, env, cwd=root)
    work = root / "work"
    return SimpleNamespace(
        env=env, root=root, work=work, dir=work / "multilingual", output=result.stderr
    )


def log_config(train_log):
    return next(line for line in train_log.splitlines() if "'optimization':" in line)


@pytest.mark.training
def test_multilingual_trains_one_model_over_the_pairs(multilingual):
    """One data-bin (one dictionary for every language), one model per init
    trained by fairseq's multilingual task on both pairs; the natural bias
    with one prior row per target language, selected by De's and Fr's
    language tokens; stock fairseq's transformer beside it."""
    data = multilingual.dir / "data-bin"
    dicts = {lang: (data / f"dict.{lang}.txt").read_text() for lang in ("de", "en", "fr")}
    assert dicts["de"] == dicts["en"] == dicts["fr"]
    for pair in ML_PAIRS:
        for lang in pair.split("-"):
            for split in ("train", "valid", "test"):
                assert (data / f"{split}.{pair}.{lang}.bin").is_file(), (split, pair, lang)
    runs = multilingual.dir / "runs"
    logs = {
        init: (runs / init / "seed1" / "train.log").read_text() for init in ("unigram", "stock")
    }
    for init, log in logs.items():
        assert "done training" in log, init
        config = log_config(log)
        for setting in (
            "task='translation_multi_simple_epoch'",
            "lang_pairs='en-de,en-fr'",
            f"lang_dict='{data}/langs.txt'",  # the tokens' order fixed: de, en, fr
            "encoder_langtok='src'",
            "decoder_langtok=True",
            "source_lang=None",  # trained on every pair
            "'best_checkpoint_metric': 'loss'",  # no validation BLEU in this task
        ):
            assert setting in config, (init, setting)
    assert "arch='transformer_natbias'" in log_config(logs["unigram"])
    assert "natbias_prior='per-language'" in log_config(logs["unigram"])
    assert "arch='transformer'" in log_config(logs["stock"])
    assert "natbias_init=" not in log_config(logs["stock"])
    for target in ("train.en-de.de", "train.en-fr.fr"):
        assert re.search(rf"tokens counted in \S+/{re.escape(target)}\b", logs["unigram"]), target
    import torch
    from fairseq.data import Dictionary

    state = torch.load(runs / "unigram" / "seed1" / "checkpoint_best.pt", weights_only=False)
    # The task appends __de__, __en__, __fr__ (langs.txt's order) to the dictionary.
    size = len(Dictionary.load(str(data / "dict.en.txt")))
    langs = (data / "langs.txt").read_text().split()
    assert langs == ["de", "en", "fr"]
    assert state["cfg"]["model"].natbias_language_tokens == [
        size + langs.index("de"),
        size + langs.index("fr"),
    ]
    assert tuple(state["model"]["decoder.output_projection.bias"].shape) == (3, size + 3)


@pytest.mark.training
def test_multilingual_scores_each_direction(multilingual):
    """Each direction is decoded by fairseq-generate from its own test split
    (its references are that direction's target text) and scored with
    sacreBLEU, signatures kept; a table per direction over the two models."""
    for pair in ML_PAIRS:
        src, tgt = pair.split("-")
        corpus = "-".join(sorted((src, tgt)))
        reference = (multilingual.work / "corpus" / corpus / "raw" / f"test.{tgt}").read_text()
        references = reference.splitlines()
        assert len(references) == 20
        for init in ("unigram", "stock"):
            run = multilingual.dir / pair / "runs" / init / "seed1"
            gen = (run / "test.gen").read_text()
            targets = dict(re.findall(r"^T-(\d+)\t(.*)$", gen, flags=re.M))
            assert [targets[str(i)] for i in range(20)] == references, (pair, init)
            assert all(s.startswith(f"__{src}__ ") for s in re.findall(r"^S-\d+\t(.*)$", gen, re.M))
            hyps = (run / "test.hyp").read_text().splitlines()
            assert len(hyps) == 20 and not any("__" in h or "\u2581" in h for h in hyps)
            bleu = json.loads((run / "test.bleu.json").read_text())
            chrf = json.loads((run / "test.chrf.json").read_text())
            assert bleu["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
            assert "nc:6" in chrf["signature"]
        results = multilingual.dir / pair / "results.md"
        text = results.read_text()
        assert f"## Multilingual {src}→{tgt} (one model: en-de en-fr)" in text
        assert "BLEU signature: `nrefs:1|case:mixed" in text
        rows = {
            cells[0]: cells[1:]
            for line in text.splitlines()
            if line.startswith("| ")
            for cells in [[c.strip() for c in line.strip("|").split("|")]]
        }
        for init in ("unigram", "stock"):
            run = multilingual.dir / pair / "runs" / init / "seed1"
            scores = [
                f"{json.loads((run / f'test.{m}.json').read_text())['score']:.2f}"
                for m in ("bleu", "chrf")
            ]
            assert rows[init] == ["1", *scores], (pair, init)


@pytest.mark.training
def test_multilingual_rerun_skips_and_a_stopped_run_resumes(multilingual):
    result = run_recipe(MULTILINGUAL, multilingual.env, cwd=multilingual.root)
    said = result.stderr
    for step in (
        "corpus/de-en/raw",
        "corpus/en-fr/raw",
        "multilingual/spm",
        "multilingual/data-bin",
    ):
        assert f"skip: {multilingual.work / step} (done)" in said, step
    assert said.count("(trained)") == 2 and said.count("(scored)") == 4
    assert "training en-de,en-fr" not in said
    run = multilingual.dir / "runs-resume" / "unigram" / "seed1"
    run.mkdir(parents=True)
    for name in ("checkpoint_last.pt", "train.log"):
        shutil.copy(multilingual.dir / "runs" / "unigram" / "seed1" / name, run / name)
    first = (run / "train.log").read_text()
    env = dict(multilingual.env, STEPS="train", INITS="unigram", RUNS_NAME="runs-resume")
    result = run_recipe(MULTILINGUAL, dict(env, MAX_UPDATE="11"), cwd=multilingual.root)
    assert "resuming en-de,en-fr unigram seed 1" in result.stderr
    resumed = (run / "train.log").read_text()[len(first) :]
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ 10 updates\)", resumed)
    assert "num_updates 11" in resumed and "done training" in resumed
    assert "tokens counted" not in resumed  # the prior rows come from the checkpoint


# --- the library, without training ------------------------------------------------


def lib(snippet, tmp_path, env=None, check=True):
    """Run bash code with recipes/lib.sh sourced (which sets every setting of
    defaults.sh not in the environment); returns stdout (the CompletedProcess
    unless ``check``)."""
    result = subprocess.run(
        ["bash", "-c", f"set -euo pipefail; source {RECIPES / 'lib.sh'}\n{snippet}"],
        cwd=tmp_path,
        env=dict(os.environ, **(env or {})),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if not check:
        return result
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize(
    "ngpus, nnodes, cpu_workers, max_tokens, given, expected",
    [
        (1, 1, 1, 4096, "", 8),  # 1 GPU: accumulate 8 steps to 32768 tokens
        (4, 1, 1, 4096, "", 2),
        (8, 2, 1, 4096, "", 1),  # 16 GPUs do it in one step
        (8, 1, 1, 2048, "", 2),
        (0, 1, 2, 4096, "", 4),  # 2 CPU workers
        (1, 1, 1, 4096, "3", 3),  # UPDATE_FREQ given: kept
    ],
)
def test_update_freq_keeps_tokens_per_update(
    tmp_path, ngpus, nnodes, cpu_workers, max_tokens, given, expected
):
    out = lib(
        f"NGPUS={ngpus} NNODES={nnodes} CPU_WORKERS={cpu_workers} "
        f"MAX_TOKENS={max_tokens} TOKENS_PER_UPDATE=32768 UPDATE_FREQ={given}; "
        "update_freq",
        tmp_path,
    )
    assert out.strip() == str(expected)


def test_gpu_launcher_is_torchrun(tmp_path):
    """With GPUs, launch runs torchrun with the node layout and gives fairseq
    the matching world size (a stand-in torchrun records its arguments)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "torchrun").write_text('#!/bin/sh\necho "$@"\n')
    (fake / "torchrun").chmod(0o755)
    lib(
        "NGPUS=4 NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 MASTER_PORT=29511 CPU_WORKERS=1; "
        "launch train.log --max-tokens 4096",
        tmp_path,
        env={"PATH": os.pathsep.join([str(fake), str(BIN), os.environ["PATH"]])},
    )
    assert not (tmp_path / "train.log").exists()  # node 1 writes its own log
    args = (tmp_path / "train.node1.log").read_text().split()
    assert args[:10] == [
        "--nproc_per_node",
        "4",
        "--nnodes",
        "2",
        "--node_rank",
        "1",
        "--master_addr",
        "10.0.0.1",
        "--master_port",
        "29511",
    ]
    assert args[10].endswith("fairseq-train")
    assert args[11:] == ["--max-tokens", "4096", "--distributed-world-size", "8"]


def test_grid_order_and_job_array_task(tmp_path):
    (tmp_path / "external.counts").write_text("x 1\n")
    out = lib(
        'DIR=$PWD INITS="unigram zero none" SEEDS="1 2" UNIGRAM_REG_WEIGHT=0.1 '
        "UNIGRAM_REG_INITS=none GRID_TASK=; grid_runs; echo; GRID_TASK=7; grid_runs",
        tmp_path,
    )
    full, task = out.split("\n\n")
    assert full.splitlines() == [
        f"{name} {seed}"
        for name in ("unigram", "zero", "none", "file", "none-unireg")
        for seed in (1, 2)
    ]
    assert task.split() == ["file", "2"]


def test_appendix_variants_pass_their_options(tmp_path):
    """A.4 runs get the colleague's criterion and its options, A.7 runs the
    counts file; the others the paper's label-smoothed cross-entropy."""
    show = 'train_args {} 1 run; printf "%s\\n" "${{ARGS[@]}}"; echo ==='
    out = lib(
        "SRC=de TGT=en DIR=$PWD NGPUS=0 UNIGRAM_REG_WEIGHT=0.3 UNIGRAM_REG_UPDATES=500; "
        + "; ".join(show.format(name) for name in ("none-unireg", "file", "zero")),
        tmp_path,
    )
    unireg, file, zero = (args.split("\n") for args in out.strip("=\n").split("\n===\n"))

    def value(args, option):
        assert args.count(option) == 1, option
        return args[args.index(option) + 1]

    assert value(unireg, "--criterion") == "unigram_regularized_cross_entropy"
    assert value(unireg, "--unigram-reg-weight") == "0.3"
    assert value(unireg, "--unigram-reg-updates") == "500"
    assert value(unireg, "--natbias-init") == "none"
    assert value(file, "--natbias-init") == "file"
    assert value(file, "--natbias-counts") == f"{tmp_path}/external.counts"
    for args in (file, zero):
        assert value(args, "--criterion") == "label_smoothed_cross_entropy"
    assert "--natbias-counts" not in zero
    assert value(zero, "--adam-betas") == "(0.9, 0.997)"
    assert value(zero, "--eval-bleu-args") == '{"beam": 5}'
    assert "--fp16" not in zero  # CPU


def test_unigram_label_smoothing_runs_have_their_own_names_and_criterion(tmp_path):
    """UNIGRAM_LS_INITS adds <init>-unigram-ls runs after the paper's grid,
    trained with the unigram-smoothed criterion and the init they name."""
    out = lib(
        'SRC=de TGT=en DIR=$PWD NGPUS=0 INITS="unigram zero" UNIGRAM_LS_INITS="unigram none"; '
        'grid_names; echo ===; train_args none-unigram-ls 1 run; printf "%s\\n" "${ARGS[@]}"',
        tmp_path,
    )
    names, args = out.split("===\n")
    assert names.split() == ["unigram", "zero", "unigram-unigram-ls", "none-unigram-ls"]
    args = args.split("\n")
    assert args.count("--criterion") == 1
    assert args[args.index("--criterion") + 1] == "unigram_label_smoothed_cross_entropy"
    assert args[args.index("--natbias-init") + 1] == "none"
    assert args[args.index("--label-smoothing") + 1] == "0.1"


def test_multilingual_runs_pass_the_task_the_prior_and_stock(tmp_path):
    """MULTILINGUAL=1: every pair to one fairseq-train (no direction, no
    validation BLEU: the multilingual task computes none), NATBIAS_PRIOR to
    the natural-bias runs (not to `none`, which has no bias), stock fairseq's
    transformer without the plugin's options; fairseq-generate gets the
    direction."""
    show = 'train_args {} 1 run; printf "%s\\n" "${{ARGS[@]}}"; echo ==='
    out = lib(
        'DIR=$PWD NGPUS=0 MULTILINGUAL=1 PAIRS="en-de  en-fr" ARCH=transformer_natbias; '
        + "; ".join(show.format(name) for name in ("unigram", "none", "stock"))
        + '; NATBIAS_PRIOR=pooled; train_args zero 1 run; printf "%s\\n" "${ARGS[@]}"'
        + '; echo ===; SRC=en TGT=fr; task_args generate; printf "%s\\n" "${TASK[@]}"',
        tmp_path,
    )
    unigram, none, stock, zero, generate = (a.split("\n") for a in out.strip("\n").split("\n===\n"))
    task = ["--task", "translation_multi_simple_epoch", "--lang-pairs", "en-de,en-fr",
            "--lang-dict", f"{tmp_path}/data-bin/langs.txt",
            "--encoder-langtok", "src", "--decoder-langtok"]  # fmt: skip
    for args in (unigram, none, stock, zero):
        assert args[3 : 3 + len(task)] == task
        assert "--source-lang" not in args and "--eval-bleu" not in args
        assert "--maximize-best-checkpoint-metric" not in args
    assert unigram[unigram.index("--natbias-prior") + 1] == "per-language"
    assert zero[zero.index("--natbias-prior") + 1] == "pooled"
    assert "--natbias-prior" not in none and none[none.index("--natbias-init") + 1] == "none"
    assert stock[stock.index("--arch") + 1] == "transformer"
    assert not [a for a in stock if a.startswith("--natbias")]
    assert generate == [*task, "--source-lang", "en", "--target-lang", "fr"]


def test_multilingual_refusals_name_the_fix(tmp_path):
    """Stock beside a preset (whose sizes fairseq's transformer lacks), and
    counts from external text for a model with several target languages:
    one line each, nothing trained or written."""
    result = lib(
        "DIR=$PWD MULTILINGUAL=1 PAIRS=en-de ARCH=transformer_natbias_iwslt_de_en; "
        "train_args stock 1 run",
        tmp_path,
        check=False,
    )
    assert result.returncode != 0
    assert "set ARCH=transformer_natbias" in result.stderr.strip().splitlines()[-1]
    result = run_recipe(
        MULTILINGUAL, {"EXTERNAL_TEXT": "c4", "WORK_DIR": tmp_path / "w"}, cwd=tmp_path, check=False
    )
    assert result.returncode != 0
    assert "unset EXTERNAL_TEXT" in result.stderr.strip().splitlines()[-1]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "script",
    RECIPE_SCRIPTS + [RECIPES / "lib.sh", DEFAULTS, RECIPES / "slurm.sbatch"],
    ids=lambda p: str(Path(p).relative_to(RECIPES)),
)
def test_scripts_parse(script):
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_every_recipe_lists_every_setting():
    """Each recipe lists, at its top, every variable lib.sh reads from it."""
    internal = {
        "NATBIAS_RECIPES",
        "NATBIAS_REPO",
        "NATBIAS_USER_VARS",
        "NATBIAS_RECIPE_FILE",
        "PATH",
        "SRC",
        "TGT",
        "DIR",
        "RUNS",
        "MODELS",
        "ARGS",
        "TASK",
        "MODEL",
        "DATASET",
        "RECIPE_NAME",
        "PYTHONPATH",
        "PYTHONWARNINGS",
        "OMP_NUM_THREADS",
        "CUDA_VISIBLE_DEVICES",
        "AFROMT_DATA_ID",
        "AFROMT_REPO_RAW",
        "BASH_SOURCE",
        "BASH_REMATCH",
    }
    read = set(re.findall(r"\$\{?([A-Z][A-Z0-9_]+)", (RECIPES / "lib.sh").read_text())) - internal
    for script in RECIPE_SCRIPTS:
        listed = recipe_settings(script)
        assert len(listed) == len(set(listed)), script
        assert read <= set(listed), (script, sorted(read - set(listed)))


# --- settings: defaults.sh, each recipe's departures from it, run.sh --help --------


def unquoted(value):
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value


def expected_settings(script, env):
    """{name: (value, comment)} as run.sh --help should print them: the
    environment's value, else the recipe's, else defaults.sh's (with $NAME and
    ${NAME} of earlier settings expanded, as bash does), and the comment of the
    recipe's line when it sets the name, else defaults.sh's."""
    recipe = {name: (value, comment) for name, value, comment in setting_lines(script)}
    expected = {}
    for name, value, comment in setting_lines(DEFAULTS):
        value, comment = recipe.get(name, (value, comment))
        value = re.sub(r"\$\{?([A-Z][A-Z0-9_]*)\}?", lambda m: expected[m[1]][0], unquoted(value))
        expected[name] = (env.get(name, value), comment)
    return expected


def printed_settings(output):
    """{name: (value, comment)} of run.sh --help's NAME=value   # comment lines."""
    printed = {}
    for line in output.splitlines():
        match = re.fullmatch(r'([A-Z][A-Z0-9_]*)=("[^"]*"|\S*)\s*(#.*)?', line)
        if match:
            assert match[1] not in printed, line
            printed[match[1]] = (unquoted(match[2]), match[3] or "")
    return printed


@pytest.mark.parametrize("script", RECIPE_SCRIPTS, ids=lambda p: p.parent.name)
def test_help_prints_every_setting_as_it_would_be_used(script, tmp_path):
    """--help lists defaults.sh's settings in its order and sections, each with
    the environment's value, else the recipe's, else the default, and the
    comment of the line it comes from; and runs nothing."""
    env = {"SMOKE": "0", "SEEDS": "7 8"}
    result = run_recipe(script, env, cwd=tmp_path, args=["--help"])
    printed = printed_settings(result.stdout)
    given = {k: v for k, v in recipe_env(env).items() if k in recipe_settings()}
    expected = expected_settings(script, given)
    assert list(printed) == list(expected) == recipe_settings(script)
    for name in expected:
        assert printed[name] == expected[name], name
    assert printed["SEEDS"][0] == "7 8" and printed["NGPUS"][0] == "0"  # the environment's
    sections = [line for line in DEFAULTS.read_text().splitlines() if line.startswith("# --- ")]
    assert [line for line in result.stdout.splitlines() if line.startswith("# --- ")] == sections
    assert list(tmp_path.iterdir()) == []  # nothing made


def test_help_shows_recipe_values_over_defaults(tmp_path):
    wmt = printed_settings(
        run_recipe(
            RECIPES / "wmt14_de_en" / "run.sh", {"SMOKE": "0"}, cwd=tmp_path, args=["-h"]
        ).stdout
    )
    assert wmt["MAX_UPDATE"] == (
        "300000",
        next(
            c for n, _, c in setting_lines(RECIPES / "wmt14_de_en" / "run.sh") if n == "MAX_UPDATE"
        ),
    )
    assert wmt["LR"][0] == "7e-4" and wmt["WARMUP"][0] == "4000"
    template = printed_settings(
        run_recipe(
            RECIPES / "template" / "run.sh",
            {"SMOKE": "0", "SRC": "fr", "TGT": "en"},
            cwd=tmp_path,
            args=["--help"],
        ).stdout
    )
    assert template["PAIRS"][0] == "fr-en" and template["WORK_DIR"][0] == "work/fr_en"
    assert template["SPM_VOCAB"][0] == "8000"


def test_help_under_smoke_shows_smoke_values_unless_given(tmp_path):
    """SMOKE=1: a smoke value wins over the recipe's own value (WMT's 300000
    updates), never over the environment's."""
    wmt = RECIPES / "wmt14_de_en" / "run.sh"
    smoke = printed_settings(run_recipe(wmt, {}, cwd=tmp_path, args=["--help"]).stdout)
    assert smoke["MAX_UPDATE"][0] == "30" and smoke["SPM_VOCAB"][0] == "1000"
    assert smoke["SAVE_INTERVAL_UPDATES"][0] == "0" and smoke["LR"][0] == "1e-3"
    given = printed_settings(
        run_recipe(wmt, {"MAX_UPDATE": "7", "LR": "2e-4"}, cwd=tmp_path, args=["--help"]).stdout
    )
    assert given["MAX_UPDATE"][0] == "7" and given["LR"][0] == "2e-4"
    assert given["SPM_VOCAB"][0] == "1000"


def test_other_arguments_are_refused(tmp_path):
    result = run_recipe(IWSLT, cwd=tmp_path, args=["--seeds"], check=False)
    assert result.returncode != 0 and "usage:" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "script", RECIPE_SCRIPTS + [DEFAULTS], ids=lambda p: str(Path(p).relative_to(RECIPES))
)
def test_every_setting_is_defined_once(script):
    """A recipe sets only names defaults.sh defines (a typo would be a new,
    unused variable), each once, and only to a value other than the default."""
    defaults = {name: unquoted(value) for name, value, _ in setting_lines(DEFAULTS)}
    names = [name for name, _, _ in setting_lines(script)]
    assert len(names) == len(set(names)), script
    if script == DEFAULTS:
        return
    assert set(names) <= set(defaults), sorted(set(names) - set(defaults))
    blanks = TEMPLATE_BLANKS if script.parent.name == "template" else set()
    same = [
        name
        for name, value, _ in setting_lines(script)
        if unquoted(value) == defaults[name] and name not in blanks
    ]
    assert not same, f"{script} repeats the default of {same}"


def test_smoke_settings_are_documented():
    """Each setting SMOKE=1 changes says so ([smoke: x]) in the comment --help
    shows, for every recipe."""
    smoke = re.findall(r"^\s*smoke_default (\w+)", (RECIPES / "lib.sh").read_text(), flags=re.M)
    assert "MAX_UPDATE" in smoke and "NGPUS" in smoke
    for script in RECIPE_SCRIPTS:
        comments = {name: comment for name, (_, comment) in expected_settings(script, {}).items()}
        assert not [n for n in smoke if "[smoke:" not in comments[n]], script
