"""research/install_matrix.py: its table from resolutions made up here (the
real one asks the package index, which the tests do not)."""

from research_scripts import benchmark_script


def test_the_table_names_what_would_pull_fairseqs_needs_in(monkeypatch, tmp_path, capsys):
    script = benchmark_script("install_matrix")
    resolutions = {
        "py-good": ("3.13.0", {"torch": "2.14.1", "transformers": "5.25.0", "numpy": "2.5.5"}),
        "py-bad": ("3.10.13", {"torch": "2.14.1", "omegaconf": "2.3", "hydra-core": "1.3.2"}),
        "py-fails": (
            "3.9.18",
            "ERROR: Package requires a different Python: 3.9.18 not in '>=3.10'",
        ),
    }
    monkeypatch.setattr(script, "resolve", lambda python, extra: resolutions[python])
    script.main(["py-good", "py-bad", "py-fails", "--out", str(tmp_path / "matrix.md")])
    rows = capsys.readouterr().out.strip().splitlines()[2:]
    assert rows[0] == "| 3.13.0 | resolves (3 packages) | 2.14.1 | 5.25.0 | none |"
    assert rows[1] == "| 3.10.13 | resolves (3 packages) | 2.14.1 | - | hydra-core, omegaconf |"
    assert rows[2].startswith("| 3.9.18 | fails: ERROR: Package requires a different Python")
    assert (
        "python research/install_matrix.py py-good py-bad py-fails"
        in (tmp_path / "matrix.md").read_text()
    )
