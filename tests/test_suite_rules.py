"""Rules the suite keeps so that it stays fast on a 2-core machine."""

import ast

from natbias_testing import REPO

TEST_FOLDERS = (REPO / "tests", REPO / "research" / "tests")


def test_every_ctranslate2_model_in_the_tests_runs_on_one_thread():
    """CTranslate2's default thread pool stays busy after a call returns: in
    the same test process it took 71 CPU-s where 15 did for the real-text
    test of test_ct2_fairseq.py (three times the wall time on 2 cores).
    Every Translator and Generator a test makes is given intra_threads=1."""
    found, without = 0, []
    for folder in TEST_FOLDERS:
        for path in sorted(folder.glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("Translator", "Generator")
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "ctranslate2"
                ):
                    found += 1
                    if "intra_threads" not in {k.arg for k in node.keywords}:
                        without.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found >= 10 and not without, without
