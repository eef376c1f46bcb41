"""README.md stays short and every relative link in it and in docs/*.md leads somewhere.

The README is the front page (what it is, install, quickstart, the main calls, links); the rest lives
in docs/ pages it links. A moved or renamed section would leave a link to nothing, so every relative
link of README.md and docs/*.md (``[text](path#anchor)``, images included, code blocks excluded) must
name an existing file and, when it has an anchor into a Markdown file, a heading of that file under
GitHub's anchor rules (lower case; punctuation other than ``-`` and ``_`` dropped; each space a
``-``; a repeated heading gets ``-1``, ``-2``, ...). The slug function is checked against headings
whose GitHub anchors were read off github.com.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 250

_FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.S | re.M)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(?:<([^>\n]*)>|([^)\s]+))(?:\s+\"[^\"]*\")?\s*\)")


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code spans (links there are not links)."""
    text = _FENCE.sub("", text)
    return re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", "", text, flags=re.S)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading's rendered text (before the -1, -2 suffix of repeats)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text)                           # inline HTML
    text = text.replace("`", "").replace("*", "")                 # code and emphasis markers
    text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text)                # _emphasis_, not snake_case
    text = text.strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set:
    """Every anchor of a Markdown file's headings (ATX ``#`` headings outside code), with repeats."""
    seen: dict = {}
    out = set()
    for line in _FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = github_slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    # explicit HTML anchors, if a page ever needs one
    out |= set(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", path.read_text(encoding="utf-8")))
    return out


def relative_links(path: Path):
    """(target, line number) of every relative link in a Markdown page's prose."""
    text = path.read_text(encoding="utf-8")
    prose = _prose(text)
    for m in _LINK.finditer(prose):
        target = m.group(1) if m.group(1) is not None else m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):   # http:, https:, mailto:, ...
            continue
        yield target


@pytest.mark.parametrize("heading, slug", [
    # the first two are anchors this repository already linked (README → itself, README → HISTORY.md);
    # the others follow GitHub's rules: code marks and punctuation dropped, "_" kept, each space a "-"
    ("Hook points under TransformerLens's own code", "hook-points-under-transformerlenss-own-code"),
    ("Quiet machine (this session, commit after the geometry speed-ups) — target met",
     "quiet-machine-this-session-commit-after-the-geometry-speed-ups--target-met"),
    ("A second offline model: Gemma 3 270M", "a-second-offline-model-gemma-3-270m"),
    ("bayes_lens's own hook points", "bayes_lenss-own-hook-points"),
    ("`bl.geometry` and `collect`", "blgeometry-and-collect"),
    ("In a notebook (Colab)", "in-a-notebook-colab"),
])
def test_github_slug(heading, slug):
    assert github_slug(heading) == slug


def test_repeated_headings_get_numbered_anchors(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# A\n\n## Notes\n\n```\n## Notes\n```\n\n## Notes\n\n### Notes!\n", encoding="utf-8")
    assert anchors(page) == {"a", "notes", "notes-1", "notes-2"}


def test_link_finder_skips_code_and_absolute_addresses(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("See [a](a.md#x), ![img](g/i.png) and [web](https://example.org/y).\n"
                    "`[not](a link)` and\n\n```python\nx = [1](2)\n```\n[b](<b c.md>)\n", encoding="utf-8")
    assert list(relative_links(page)) == ["a.md#x", "g/i.png", "b c.md"]


def test_readme_is_short():
    n = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; move detail to a docs/ page and link it"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in relative_links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_readme_links_every_docs_page():
    """Each docs/ page is reachable from the front page."""
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links(ROOT / "README.md")}
    orphans = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not orphans, f"docs pages the README does not link: {orphans}"
