"""The front door: README.md's first command within its first 25 lines; no issue number in README or
docs/ (CHANGELOG.md keeps them; a reference to another project's tracker, `owner/repo#N` or
`pytorch#N`, names its project); docs/README.md indexes every page of docs/."""
import re

from tests.helpers.dist import ROOT

PAGES = sorted((ROOT / "docs").glob("*.md"))


def test_the_readme_opens_with_its_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("make ") or line.startswith("```bash"))
    assert first < 25, first
    assert "make quickstart" in "\n".join(lines[:25]) and "make test" in "\n".join(lines[:25])


def test_no_issue_numbers_outside_the_changelog():
    own = re.compile(r"(?<![\w/.&-])#\d+\b|\bissues? \d+\b", re.I)  # &#124;: an HTML entity
    found = [(page.name, n + 1, line.strip()) for page in [ROOT / "README.md", *PAGES]
             for n, line in enumerate(page.read_text().splitlines()) if own.search(line)]
    assert not found, found


def test_the_docs_index_names_every_page():
    index = (ROOT / "docs" / "README.md").read_text()
    missing = [p.name for p in PAGES if p.name != "README.md" and f"({p.name})" not in index]
    assert not missing, missing
