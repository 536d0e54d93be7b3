"""The documents a user reads stay short, honest and linked.

- README.md: at most 150 lines; everything above its set-up section at most
  30 lines of at most 120 characters.
- README.md's results table has the four arms side by side (stock fairseq,
  stock + criterion, natural bias, natural bias + criterion), so that what the
  criterion gives is not credited to the bias; every figure of a row is in a
  results file the row links, under research/results/.
- The docs (docs/*.md) are the pages listed below, at most 1,800 lines in
  all (the project's budget for what a newcomer reads), the design page for
  contributors (docs/design.md) among them; the changelog starts at the
  package's version, after the changes not yet released, if any (an
  "Unreleased" section, on top).
- No line of README.md or docs/*.md names an internal issue ("issue 36",
  "(#12)") or a date, the changelog's release headings aside.
- Where the criterion is described, its prior art is credited.
- The relative links of README.md and docs/*.md lead to files (and headings)
  that exist.
- CITATION.cff carries the package's version and the changelog's date for it.
"""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
SETUP_HEADING = "## Set-up"
ARMS = ["stock fairseq", "stock + criterion", "natural bias", "natural bias + criterion"]
PAGES = {
    "installation",
    "options",
    "criteria",
    "language_models",
    "tools",
    "checkpoints",
    "half_precision",
    "huggingface",
    "pretraining",
    "deployment",
    "scaling",
    "results",
    "changelog",
    "design",
}
MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
ISSUE = re.compile(r"\b(?:issues?|pull requests?|PR)\s*#?\d+|#\d+(?![\w-])", re.I)
DATE = re.compile(
    rf"\b(?:19|20)\d\d-\d\d-\d\d\b|\b(?:{MONTHS})\s+(?:\d{{1,2}},?\s+)?(?:19|20)\d\d\b"
)
RELEASE_HEADING = re.compile(r"^## \d+\.\d+\.\d+ \((\d{4}-\d\d-\d\d)\)$")


def user_pages() -> list:
    return [README, *sorted(DOCS.glob("*.md"))]


def lines_of(path: Path) -> list:
    return path.read_text(encoding="utf-8").split("\n")


def first_screen(text: str) -> list:
    lines = text.split("\n")
    return lines[: next(i for i, line in enumerate(lines) if line.startswith(SETUP_HEADING))]


def cells(row: str) -> list:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def results_table(text: str) -> tuple:
    """The header and body rows of the first Markdown table whose header names
    stock fairseq."""
    lines = text.split("\n")
    start = next(
        i for i, line in enumerate(lines) if line.startswith("|") and "stock fairseq" in line
    )
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(cells(line))
    return cells(lines[start]), rows


def figures(cell: str) -> list:
    """The decimal figures of a cell (4.319, −0.131, +0.54, 1.020×), unsigned."""
    return re.findall(r"\d+\.\d+", cell)


def missing_figures(row, columns, root: Path = REPO) -> list:
    """Figures of the row's cells ``columns`` found in none of the results files
    the row links; each link must lead under research/results/."""
    texts = []
    for target in re.findall(r"\]\(([^)#\s]+)", " | ".join(row)):
        path = (root / target).resolve()
        assert path.is_relative_to((root / "research" / "results").resolve()), (
            f"row {row[0]!r}: {target} is not under research/results/"
        )
        texts.append(path.read_text(encoding="utf-8"))
    assert texts, f"row {row[0]!r}: no link to a results file"
    return [
        figure
        for column in columns
        for figure in figures(row[column])
        if not any(re.search(rf"(?<![\d.]){re.escape(figure)}(?!\d)", text) for text in texts)
    ]


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    heading = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def anchors(path: Path) -> set:
    found, in_code = set(), False
    for line in lines_of(path):
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


def forbidden_lines(path: Path) -> list:
    """Lines naming an internal issue or a date; a changelog's release
    headings may carry their date."""
    found = []
    for number, line in enumerate(lines_of(path), 1):
        if ISSUE.search(line):
            found.append(f"{path.name}:{number}: issue: {line.strip()}")
        if DATE.search(line) and not (path.name == "changelog.md" and RELEASE_HEADING.match(line)):
            found.append(f"{path.name}:{number}: date: {line.strip()}")
    return found


def package_version() -> str:
    text = (REPO / "natbias" / "__init__.py").read_text(encoding="utf-8")
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


# --- the checks can fail ----------------------------------------------------------------


def test_a_figure_missing_from_its_results_file_is_found(tmp_path):
    results = tmp_path / "research" / "results"
    results.mkdir(parents=True)
    (results / "study.md").write_text("| stock | 4.319 ± 0.008 | -0.131 | 0.71x | 10.54 |\n")
    row = ["3,000 pairs", "4.319", "−0.131 / 0.54", "0.71×", "[s](research/results/study.md)"]
    assert missing_figures(row, [1, 2, 3], tmp_path) == ["0.54"]
    elsewhere = ["3,000 pairs", "4.319", "", "", "[s](docs/study.md)"]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "study.md").write_text("4.319\n")
    with pytest.raises(AssertionError, match="not under research/results"):
        missing_figures(elsewhere, [1], tmp_path)


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "a.md").write_text(
        "# A → b: `c` (d)\n[ok](a.md#a--b-c-d) [gone](b.md) [bad](a.md#nope)\n"
    )
    assert broken_links(tmp_path / "a.md") == ["b.md", "a.md#nope"]


def test_issue_numbers_and_dates_are_found(tmp_path):
    page = tmp_path / "changelog.md"
    page.write_text(
        "## 1.0.0 (2026-12-02)\nas issue 36 asked\nfixed (#12)\nsee [x](#3000-pairs)\n"
        "measured 2026-11-29\nin January 2024\nthe 2,000 updates of 2023\n"
    )
    assert [line.split(": ")[1] for line in forbidden_lines(page)] == [
        "issue",
        "issue",
        "date",
        "date",
    ]
    other = tmp_path / "results.md"
    other.write_text("## 1.0.0 (2026-12-02)\n")
    assert len(forbidden_lines(other)) == 1


# --- the pages --------------------------------------------------------------------------


def test_the_readme_is_at_most_150_lines():
    assert len(lines_of(README)) <= 150


def test_the_readme_first_screen_is_at_most_30_lines_of_120_characters():
    screen = first_screen(README.read_text(encoding="utf-8"))
    assert len(screen) <= 30
    assert [line for line in screen if len(line) > 120] == []


def test_the_readme_results_table_separates_the_bias_from_the_criterion():
    header, rows = results_table(README.read_text(encoding="utf-8"))
    assert header[1:5] == ARMS
    assert len(rows) >= 3
    for row in rows:
        assert any(figures(row[column]) for column in range(1, 5)), (
            f"row {row[0]!r} shows no figure"
        )
        assert missing_figures(row, range(1, 5)) == [], row[0]


def test_the_docs_are_the_listed_pages_in_at_most_1800_lines():
    pages = sorted(DOCS.glob("*.md"))
    assert {page.stem for page in pages} == PAGES
    assert sum(len(lines_of(page)) for page in pages) <= 1800


def test_no_user_page_names_an_internal_issue_or_a_date():
    assert [line for page in user_pages() for line in forbidden_lines(page)] == []


def test_the_changelog_starts_at_the_package_version():
    """Its first release is the package's version; above it, at most the
    changes not yet released, under "Unreleased"."""
    headings = [line for line in lines_of(DOCS / "changelog.md") if line.startswith("## ")]
    if headings[0] == "## Unreleased":
        headings.pop(0)
    assert headings[0].startswith(f"## {package_version()} (")


def test_the_criterion_credits_its_prior_art():
    text = (DOCS / "criteria.md").read_text(encoding="utf-8")
    for credit in (
        "Szegedy",
        "Chorowski and Jaitly (2017)",
        "Pereyra et al.",
        "espresso",
        "--smoothing-type unigram",
    ):
        assert credit in text, credit


def test_the_citation_carries_the_release():
    citation = (REPO / "CITATION.cff").read_text(encoding="utf-8")
    version = re.search(r"^version:\s*(\S+)", citation, re.M).group(1)
    released = re.search(r"^date-released:\s*\"?([\d-]+)", citation, re.M).group(1)
    assert version == package_version()
    assert f"## {version} ({released})" in lines_of(DOCS / "changelog.md")


@pytest.mark.parametrize("page", [str(p.relative_to(REPO)) for p in user_pages()])
def test_links_lead_somewhere(page):
    assert broken_links(REPO / page) == []
