"""The fixtures of tests/natbias_fixtures.py, the order the modules run in,
and the check that the run wrote nothing into the working tree."""

import os
import platform
from collections import Counter

import pytest
import working_tree
from natbias_fixtures import *  # noqa: F403  (the fixtures, registered here)
from natbias_testing import REPO

TREE_BEFORE = pytest.StashKey[set]()

# CTranslate2 takes oneDNN's int8 GEMM on AMD CPUs. Without VNNI (AVX2 only)
# that kernel adds pairs of u8 x s8 products in int16, which can saturate: the
# Multi30k model's mean |log p| gap to fairseq is 0.105 there, against 0.0098
# with MKL's kernel on the same AVX2 EPYC (docs/deployment.md). The converters
# are checked against int8's rounding, so there the tests ask for MKL's; read
# once, at CTranslate2's first model, so set before any test makes one. (MKL
# is x86's only: elsewhere CTranslate2 has other kernels.)
x86_linux = platform.machine() == "x86_64" and os.path.exists("/proc/cpuinfo")
if x86_linux and "vnni" not in open("/proc/cpuinfo").read():
    os.environ.setdefault("CT2_USE_MKL", "1")

# The modules that take longest, longest first (by seconds per module in a
# `make test` on 2 cores, with fairseq's tools served by tests/fork_server.py).
# `make test` runs with --dist loadscope --no-loadscope-reorder: xdist hands a
# free worker the next module in collection order, so starting with the long
# ones leaves short ones to fill the end instead of one worker finishing a
# two-minute module alone (xdist's own reordering goes by number of tests).
LONGEST_FIRST = [
    "test_vllm.py",  # vLLM in a subprocess for all families, then its server: about 2 minutes
    "test_examples.py",
    "test_half_precision.py",
    "test_recipes.py",
    "test_hf_examples.py",
    "test_ct2_fairseq.py",
    "test_transformer_natbias.py",
    "test_scoring_in_context.py",  # three models trained (fairseq MT and LM, GPT-2): 45 s alone
    "test_hf_families.py",
    "test_transformer_lm_natbias.py",
    "test_logging_hook.py",
    "test_multilingual.py",
    "test_scale_out.py",
    "test_bigram_residual.py",
    "test_documented_paths.py",  # 3 fairseq-train runs, 2 SentencePiece models: about 20 s
    "test_hf_sharding.py",
    "test_olmo_core_scaling.py",  # OLMo-core on 2 gloo processes: 7 short Trainer runs
    "test_olmo_core.py",
    "test_hf_logging.py",
    "test_natural_bias.py",
    "test_demo.py",
    "test_unigram_regularized_cross_entropy.py",
    "test_checkpoints.py",
    "test_hf_scale_out.py",
    "test_ct2_hf.py",
    "test_install.py",
    "test_hf_export.py",
    "test_generation_control.py",
    "test_init.py",
    "test_decomposition.py",
    "test_checkpoint_tools.py",
    "test_frequency.py",
    "test_sweep_lm.py",
]


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: within a module, and among the rest, the usual order


# Tests write under their temporary directories only: the working tree after
# the run holds nothing new but caches (tests/working_tree.py). Checked by the
# controller (not each xdist worker), once every test has run.
def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):
        session.config.stash[TREE_BEFORE] = working_tree.state(REPO)


def pytest_sessionfinish(session, exitstatus):
    before = session.config.stash.get(TREE_BEFORE, None)
    new = working_tree.added(before, working_tree.state(REPO)) if before is not None else []
    if new:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = "the tests wrote into the working tree (use tmp_path): " + ", ".join(new)
        if reporter:
            reporter.write_sep("=", f"ERROR: {message}", red=True, bold=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# The run ends by naming what it skipped and why, each reason with its count
# (a headline test skipped where ../shared/data is absent would otherwise pass
# unseen among the dots; under CI=true such a skip fails: skip_without_data).
@pytest.hookimpl(trylast=True)  # after --durations' table: the line above the counts
def pytest_terminal_summary(terminalreporter):
    reasons = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if not reasons:
        terminalreporter.write_sep("=", "skipped: nothing")
        return
    listed = "; ".join(f"{count} x {reason}" for reason, count in reasons.most_common())
    terminalreporter.write_sep("=", f"skipped {sum(reasons.values())}: {listed}", yellow=True)
