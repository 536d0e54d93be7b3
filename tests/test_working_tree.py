"""The check that a test run wrote nothing into the working tree
(tests/working_tree.py, run by tests/conftest.py at the end of every run)."""

import subprocess

import working_tree


def git_repo(path):
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / ".gitignore").write_text(".venv\n__pycache__/\n")
    (path / "kept.txt").write_text("tracked\n")
    (path / "tests").mkdir()
    (path / "tests" / "test_x.py").write_text("")
    subprocess.run(["git", "add", "."], cwd=path, check=True)
    return path


def test_what_a_test_leaves_is_found_and_caches_are_not(tmp_path):
    repo = git_repo(tmp_path / "repo")
    (repo / ".venv").mkdir()
    (repo / "notes.txt").write_text("the developer's own, there before the run\n")
    before = working_tree.state(repo)
    (repo / "unused").mkdir()  # an empty folder, which git status does not show
    (repo / "tests" / "out.csv").write_text("1\n")
    (repo / "kept.txt").write_text("edited by someone while the tests run\n")
    for cache in ("__pycache__", ".pytest_cache", "tests/__pycache__", ".ruff_cache", ".venv/x"):
        (repo / cache).mkdir(parents=True)
        (repo / cache / "x").write_text("")
    (repo / "notes.txt").write_text("changed, but untracked before as after\n")
    assert working_tree.added(before, working_tree.state(repo)) == [
        "++ tests/out.csv",
        "++ unused/",
        "?? tests/out.csv",
    ]


def test_outside_a_git_checkout_the_files_are_compared(tmp_path):
    before = working_tree.state(tmp_path)
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert working_tree.added(before, working_tree.state(tmp_path)) == ["++ a/", "++ a/b/"]
