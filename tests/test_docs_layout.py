"""The documents a newcomer reads first stay short, and every figure they show
is one link from the results file that holds it (issue 38).

- README.md: everything above the set-up section in at most 30 lines; each
  figure in its table's "gain" column appears in the results file the row
  links to, under benchmarks/results/.
- benchmarks/README.md: the index of the scripts, at most 250 lines.
- The relative links of these pages, of docs/results.md and of
  docs/studies/ lead to files that exist (and to headings that exist).
"""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
SETUP_HEADING = "## Set-up"


def first_screen(text: str) -> list:
    lines = text.split("\n")
    return lines[:next(i for i, line in enumerate(lines) if line.startswith(SETUP_HEADING))]


def table_rows(lines) -> list:
    """The cells of each body row of the first Markdown table in ``lines``."""
    rows = [line for line in lines if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def figures(cell: str) -> list:
    """The decimal figures of a cell (1.020×, +0.006, 26.64, ...), unsigned."""
    return re.findall(r"\d+\.\d+", cell)


def missing_figures(row, root: Path = REPO) -> list:
    """Figures of the row's "gain" cell that its linked results file lacks."""
    link = re.search(r"\]\(([^)#]+)", row[-1])
    assert link, f"row {row[0]!r}: no link to a results file"
    path = root / link.group(1)
    assert path.resolve().is_relative_to((root / "benchmarks" / "results").resolve()), \
        f"row {row[0]!r}: {link.group(1)} is not under benchmarks/results/"
    text = path.read_text(encoding="utf-8")
    return [figure for figure in figures(row[2]) if figure not in text]


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    heading = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def anchors(path: Path) -> set:
    found, in_code = set(), False
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(r"#{1,6} ", line):
            found.add(slug(re.sub(r"^#+ ", "", line)))
    return found


def broken_links(page: Path) -> list:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        full = (page.parent / path).resolve() if path else page
        if not full.exists():
            broken.append(target)
        elif anchor and full.suffix == ".md" and anchor not in anchors(full):
            broken.append(target)
    return broken


# --- the checks can fail ----------------------------------------------------------------


def test_a_figure_missing_from_its_results_file_is_found(tmp_path):
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    (results / "study.md").write_text("| default | 8.113 | 26.64 ± 0.49 | 0.67x |\n")
    row = ["start", "NLL", "8.113 bits; 26.64 ± 0.49; 0.67×; 9.999", "[s](benchmarks/results/study.md)"]
    assert missing_figures(row, tmp_path) == ["9.999"]


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# A → b: `c` (d)\n[ok](a.md#a--b-c-d) [gone](b.md) [bad](a.md#nope)\n")
    assert broken_links(tmp_path / "a.md") == ["b.md", "a.md#nope"]


# --- the pages --------------------------------------------------------------------------


def test_the_readme_first_screen_is_at_most_30_lines():
    assert len(first_screen(README.read_text(encoding="utf-8"))) <= 30


def test_each_first_screen_figure_is_in_its_results_file():
    rows = table_rows(first_screen(README.read_text(encoding="utf-8")))
    assert len(rows) >= 5
    for row in rows:
        assert figures(row[2]), f"row {row[0]!r} shows no figure"
        assert missing_figures(row) == [], row[0]


def test_the_benchmarks_index_is_at_most_250_lines():
    assert len((REPO / "benchmarks" / "README.md").read_text(encoding="utf-8").split("\n")) <= 250


@pytest.mark.parametrize("page", [
    "README.md", "benchmarks/README.md", "docs/results.md",
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs" / "studies").glob("*.md")),
])
def test_links_lead_somewhere(page):
    assert broken_links(REPO / page) == []
