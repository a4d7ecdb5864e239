"""The README and docs/ hold together: links resolve, the README stays a front door, its map of the tree is
true, and no development history (commit hashes) leaks into them."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_ZH = ROOT / "README.zh-CN.md"
PAGES = [README, README_ZH, *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def prose(text: str) -> str:
    """The text without fenced code blocks and code spans, where brackets are not links."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(_FENCE.sub("", path.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    return [t for t in _LINK.findall(prose(path.read_text()))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto:


def test_slug_matches_github() -> None:
    assert slug("Thinking mode and `reasoning_content`") == "thinking-mode-and-reasoning_content"
    assert slug("Keys, teams, limits and the admin API") == "keys-teams-limits-and-the-admin-api"
    assert slug("The rules P1\u2013P22") == "the-rules-p1p22"  # an en dash, dropped


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_check_sees_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Title\n\n[ok](#title) [bad](b.md) `[not](a link)`\n")
    assert relative_links(tmp_path / "a.md") == ["#title", "b.md"]
    assert anchors(tmp_path / "a.md") == {"title"}


def test_readme_is_a_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/"
    head = "\n".join(lines[:8])
    assert "python3 run.py serve" in head and "python3 run.py test" in head, "the two commands come first"


def where_is_what() -> list[str]:
    """The paths of docs/architecture.md's table of where each part lives (README points there)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Where the parts live", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [p for row in rows for p in re.findall(r"`((?:chatgate|tests|bench)/[^`]*)`", row)]


def test_where_is_what_names_real_paths() -> None:
    paths = where_is_what()
    assert len([p for p in paths if p.startswith("chatgate/")]) >= 8
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/architecture.md's table names paths that do not exist: {missing}"


_HASH = re.compile(r"`(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}`")
_COMMIT = re.compile(r"\bcommits?\s+`?(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", re.IGNORECASE)
# a bare abbreviated hash in prose ("at e3bc842", "<0c72d41>"); not in a link's target (a report's file)
_BARE = re.compile(r"(?<![\w/.-])(?=[0-9a-f]{0,6}[0-9])(?=[0-9a-f]{0,6}[a-f])[0-9a-f]{7}(?![\w-])")
_LINK_TARGET = re.compile(r"\]\([^)]*\)")


@pytest.mark.parametrize("page", [*PAGES, ROOT / "bench" / "README.md"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_commit_hashes(page: Path) -> None:
    text = page.read_text()
    found = _HASH.findall(text) + _COMMIT.findall(text) + _BARE.findall(_LINK_TARGET.sub("]()", text))
    assert not found, f"{page.relative_to(ROOT)} names commits {found}: history is in git, bench/HISTORY.md"


def test_the_hash_check_sees_one() -> None:
    assert _HASH.findall("until `04255af` a request") == ["`04255af`"]
    assert _COMMIT.findall("the latest, commit ab1a04a (2026-11-30)")
    assert not _HASH.findall("max_body_bytes `50331648`, a `d8b79690-…-0` handle, `deadbeef-cafe`")
    assert _BARE.findall("non-streaming at e3bc842: the reference") == ["e3bc842"]
    assert _BARE.findall("--tree <0c72d41> --tree") == ["0c72d41"]
    assert not _BARE.findall("a key id 3f9a1c0d2b7e, a handle d8b79690, the word defaced, 1234567")
    assert not _BARE.findall(_LINK_TARGET.sub("]()", "([report](../bench/reports/full-ab1a04a.md))"))


_CITED = re.compile(r"\bdocs/[\w-]+\.md(?:#[\w-]+)?")


def sources() -> list[Path]:
    """The Python and TOML files of chatgate/, tests/, bench/ and config/ (not node_modules or caches)."""
    found = []
    for root in ("chatgate", "tests", "bench", "config"):
        for folder, dirs, files in os.walk(ROOT / root):
            dirs[:] = [d for d in dirs if d not in ("node_modules", "__pycache__") and not d.startswith(".")]
            found += [Path(folder, f) for f in files if f.endswith((".py", ".toml"))]
    return found


def test_citations_in_code_resolve() -> None:
    """Code comments cite docs pages (`docs/rules-chat.md#models`, `docs/rules-chat.md U4`): they exist."""
    broken = set()
    for path in sources():
        for cited in _CITED.findall(path.read_text(errors="replace")):
            file, _, anchor = cited.partition("#")
            dest = ROOT / file
            if not dest.exists() or (anchor and anchor not in anchors(dest)):
                broken.add(f"{path.relative_to(ROOT)}: {cited}")
    assert not broken, sorted(broken)


def test_benchmark_reports_are_named_by_when_they_ran() -> None:
    """The docs link to reports by date and time (UTC), so that no commit hash reaches them through a link."""
    names = [p.name for p in (ROOT / "bench" / "reports").glob("*.md")]
    assert names
    dated = re.compile(r"20\d\d-\d\d-\d\d-\d{4}-(full|only-[\d-]+)(-[a-z\d-]+)?\.md")
    odd = [n for n in names if not dated.fullmatch(n)]
    assert not odd, f"name reports YYYY-MM-DD-HHMM-<scenarios>[-what].md: {odd}"


def test_the_chinese_front_door() -> None:
    """README.zh-CN.md is linked from the top of README.md and starts, as it does, with the two commands."""
    assert "(README.zh-CN.md)" in "\n".join(README.read_text().splitlines()[:4])
    head = "\n".join(README_ZH.read_text().splitlines()[:8])
    assert "python3 run.py serve" in head and "python3 run.py test" in head
