"""The documentation points only inside the repository: every relative link of README.md and docs/**/*.md resolves
to a file or folder of the repository, and no page names a path beside it (``../shared``, a ``papers/`` notes file).
The results pages are written by ``reports/<slug>.py``, so the generators' text is checked too: a page rebuilt
from them carries no such path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
WRITTEN = [p for p in PAGES if "results" not in p.relative_to(ROOT).parts]  # the generated pages: their reports
REPORTS = sorted((ROOT / "reports").glob("*.py"))
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
OUTSIDE = re.compile(r"\.\./shared|(?<![\w/.-])papers/[\w.-]+\.md")


def relative_links(text: str) -> list[str]:
    """The relative targets of the Markdown links and images in ``text``, without their ``#anchor``; code spans
    and fenced blocks are left out (a link written as an example is not a link)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    out = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # a URL (https:, mailto:) or an anchor on the same page
        out.append(target.split("#", 1)[0])
    return out


def broken_links(page: Path) -> list[str]:
    """Relative link targets of ``page`` that name no path inside the repository."""
    bad = []
    for target in relative_links(page.read_text(encoding="utf-8")):
        path = (page.parent / target).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            bad.append(target)
    return bad


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves_inside_the_repository(page: Path):
    assert broken_links(page) == []


@pytest.mark.parametrize("page", WRITTEN + REPORTS, ids=[str(p.relative_to(ROOT)) for p in WRITTEN + REPORTS])
def test_no_page_points_outside_the_repository(page: Path):
    assert OUTSIDE.findall(page.read_text(encoding="utf-8")) == []


def test_results_pages_name_no_shared_folder():
    assert [p.name for p in PAGES if "../shared" in p.read_text(encoding="utf-8")] == []


def test_the_checks_catch_a_link_out_and_a_missing_file(tmp_path: Path):
    """The two checks on hand-written pages: a link that leaves the repository, one to a missing file, and a
    mention of ``../shared`` are caught; a URL, an anchor, a link in a code span and a real file are not."""
    page = ROOT / "docs" / "x.md"  # never written: broken_links reads the text given to it below
    text = (
        "[a](../../outside.md) [b](methods/none.md) [c](https://example.org) [d](#top) `[e](nowhere.md)` "
        "[f](../README.md#set-up) ![g](methods/preworld.md)"
    )
    assert relative_links(text) == ["../../outside.md", "methods/none.md", "../README.md", "methods/preworld.md"]
    f = tmp_path / "page.md"
    f.write_text(text)
    bad = [t for t in relative_links(text) if not ((page.parent / t).resolve().is_relative_to(ROOT))]
    assert bad == ["../../outside.md"]
    missing = [t for t in relative_links(text) if not (page.parent / t).resolve().exists()]
    assert missing == ["../../outside.md", "methods/none.md"]
    assert OUTSIDE.findall("see ../shared/DESIGN.md and papers/tulip.md, not docs/papers_x.md") == [
        "../shared",
        "papers/tulip.md",
    ]
