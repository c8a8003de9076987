"""The documentation's shape (no services, nothing imported), for ``README.md`` and ``docs/**/*.md``:

* its links resolve: every relative link names a file of the repository, and every ``#anchor``
  names a heading of the page it points to;
* its tables are whole: every row has as many cells as its header (GitHub drops a row's extra
  cells without a word, and leaves missing ones empty; a pipe in a cell's code span splits the
  cell unless it is escaped, ``\\|``).

``docs/ARCHITECTURE.md`` promises that a reader finds any step of the data flow in one step;
a link to a heading renamed since, or to a moved file, breaks that promise silently on GitHub
(it opens the top of the page, or a 404).  Anchors are made as GitHub makes them: the heading's
text without its Markdown (code ticks, links, emphasis), lower-cased, every character that is
neither a word character, a hyphen nor a space dropped, spaces made hyphens, and ``-1``, ``-2``
... appended to repeats.  Links inside code spans and fenced blocks are not links.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+(?:\([^()\s]*\))?[^()\s]*)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)
_RULE = re.compile(r"^\s*\|?\s*:?-{3,}")  # a table's header rule: |---|---| or | :--- |


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text (see the module docstring)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"(?<!\w)_|_(?!\w)", "", text)  # emphasis underscores, not snake_case
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


@cache
def prose(page: Path) -> str:
    """``page``'s text with its fenced blocks blanked (their lines kept empty, so line numbers
    hold); read once per page."""
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), page.read_text(encoding="utf-8"))


@cache
def anchors(page: Path) -> frozenset[str]:
    """Every anchor ``page``'s headings give, repeats numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    out = set()
    for m in _HEADING.finditer(prose(page)):
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def links(page: Path) -> list[str]:
    """The relative link targets of ``page`` (outside code), in order."""
    text = _CODE.sub("", prose(page))
    return [t for t in _LINK.findall(text) if not _EXTERNAL.match(t)]


def broken(page: Path) -> list[str]:
    """``page``'s links that name no file, or no heading of the page they name."""
    out = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            out.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{target}: no heading of {dest.name} has that anchor")
    return out


def _cells(line: str) -> int:
    """How many cells a table row has, as GitHub counts them: every pipe that is not escaped
    splits, inside a code span too (a pipe in a cell's code is written ``\\|``)."""
    line = line.replace("\\|", " ").strip()
    return len(line.removeprefix("|").removesuffix("|").split("|"))


def uneven_rows(page: Path) -> list[str]:
    """``page``'s table rows whose cell count differs from their header's, as ``line N: n of m``."""
    lines = prose(page).split("\n")
    out = []
    i = 0
    while i < len(lines) - 1:
        if lines[i].lstrip().startswith("|") and _RULE.match(lines[i + 1]):
            want, j = _cells(lines[i]), i + 2
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                if (got := _cells(lines[j])) != want:
                    out.append(f"line {j + 1}: {got} cells of {want}")
                j += 1
            i = j
        else:
            i += 1
    return out


def test_slug_follows_github() -> None:
    assert slug("Events/s against Spark's bare read (issue #19), 2026-12-02") == (
        "eventss-against-sparks-bare-read-issue-19-2026-12-02"
    )
    assert slug("Decode: JVM `from_avro` or Numba over Arrow") == "decode-jvm-from_avro-or-numba-over-arrow"
    assert slug("Alert delivery: columns, one COPY into `alerts`, one Avro kernel") == (
        "alert-delivery-columns-one-copy-into-alerts-one-avro-kernel"
    )
    assert slug("**CI-COUNT** — 5,000 keys × 3 %") == "ci-count--5000-keys--3-"


def test_repeated_headings_are_numbered(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("# A\n\n## Tests\n\n```\n# not a heading\n```\n\n## Tests\n", encoding="utf-8")
    assert anchors(page) == {"a", "tests", "tests-1"}


def test_broken_links_are_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n", encoding="utf-8")
    page = tmp_path / "p.md"
    page.write_text(
        "# Here\n[ok](other.md#other-page) [self](#here) `[code](nowhere.md)` [web](https://x.org/#y)\n"
        "[gone](missing.md) [bad](other.md#nothing) [bad self](#there)\n",
        encoding="utf-8",
    )
    assert [b.split(":")[0] for b in broken(page)] == ["missing.md", "other.md#nothing", "#there"]


def test_uneven_rows_are_found(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "| a | b |\n|---|---|\n| 1 | `x \\| y` |\n| 1 | `x | y` |\n| 1 |\n\n```\n| a |\n|---|\n| 1 | 2 |\n```\n",
        encoding="utf-8",
    )
    assert uneven_rows(page) == ["line 4: 3 cells of 2", "line 5: 1 cells of 2"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(page: Path) -> None:
    assert broken(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_tables_are_whole(page: Path) -> None:
    assert uneven_rows(page) == []
