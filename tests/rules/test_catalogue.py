"""The rule catalogue in code (chatgate/rules/catalogue.py) and the docs' tables (docs/rules-*.md) agree: the
same rules, each with the same certainty and as-of date and, where a table has a level column, the same
level."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chatgate.rules.catalogue import (
    CATALOGUE,
    DOCS,
    FAMILIES,
    FamilyName,
    Level,
    lookup,
    matching,
    of_family,
    rule,
)

ROOT = Path(__file__).resolve().parents[2]
PREFIX: dict[FamilyName, str] = {"chat": "R", "anthropic": "A", "responses": "P", "fim": "F", "tools": "T"}
LEVEL_COLUMN: dict[FamilyName, int | None] = {"chat": 2, "anthropic": 2, "responses": 3, "fim": None,
                                              "tools": None}


def cells(line: str) -> list[str]:
    """A table row's cells (a `|` inside backticks is not a separator)."""
    out, cur, tick = [], "", False
    for ch in line.strip()[1:-1]:
        if ch == "`":
            tick = not tick
        if ch == "|" and not tick:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return out


def doc_rows(family: FamilyName) -> dict[str, list[str]]:
    text = (ROOT / DOCS[family]).read_text()
    rows = [cells(line) for line in text.splitlines() if re.match(rf"^\| *{PREFIX[family]}\d+ ", line)]
    return {row[0]: row for row in rows}


def doc_level(text: str) -> Level:
    """The docs' level column in the catalogue's words."""
    first = re.split(r"[\s;:(/,]", text.lower())[0]
    if first in ("enforced", "certain"):
        rest = text[len(first):].strip()
        whole = rest == "" or rest == ": 413" or (rest.startswith("(") and rest.endswith(")")
                                                  and "warned" not in rest and ";" not in rest)
        return "refused" if whole else "mixed"
    levels: dict[str, Level] = {"warned": "warned", "strict": "strict", "configurable": "configurable",
                                "optional": "configurable", "legacy": "legacy", "never": "never"}
    return levels[first]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_catalogue_has_the_docs_rules(family: FamilyName) -> None:
    assert [entry.id for entry in of_family(family)] == list(doc_rows(family))


@pytest.mark.parametrize("family", FAMILIES)
def test_certainty_and_as_of_agree_with_the_docs(family: FamilyName) -> None:
    for rule_id, row in doc_rows(family).items():
        entry = rule(family, rule_id)
        assert f"{entry.note} · {entry.as_of}" == row[-1], rule_id
        column = LEVEL_COLUMN[family]
        if column is not None:
            assert entry.level == doc_level(row[column]), rule_id


def test_every_entry_is_one_of_a_family() -> None:
    assert len({(e.family, e.id) for e in CATALOGUE}) == len(CATALOGUE)
    assert {e.certainty for e in CATALOGUE} <= {"documented", "observed", "inferred"}


def test_a_deepseek_error_is_matched_to_its_rule() -> None:
    assert [e.id for e in matching("Model Not Exist", "chat")] == ["R3"]
    found = matching("Invalid max_tokens value, the valid range of max_tokens is [1, 65536]")
    assert [(e.family, e.id) for e in found] == [("chat", "R27"), ("anthropic", "A2")]
    assert [e.id for e in matching("The supported API model names are deepseek-v4-pro or deepseek-v4-flash, "
                                   "but you passed deepseek-v4-falsh.")] == ["P2"]
    assert matching("Content Exists Risk") == []


def test_a_rule_is_looked_up_by_family_and_id() -> None:
    entry = rule("anthropic", "A7")
    assert (entry.level, entry.certainty, entry.as_of) == ("refused", "observed", "2026-07")
    assert entry.refuses and entry.doc == "docs/rules-anthropic.md"
    with pytest.raises(KeyError):
        rule("chat", "A7")


def test_a_problems_rule_is_its_entry() -> None:
    assert lookup("A18") is rule("anthropic", "A18")
    assert lookup("F3") is rule("fim", "F3") and lookup("U4") is None and lookup("R99") is None


def test_every_rule_the_code_names_is_in_the_catalogue() -> None:
    """A rule number in a family's code (a Problem's `rule`, a type error's) is an entry of the catalogue."""
    named = set()
    for path in (ROOT / "chatgate").rglob("*.py"):
        if path.parts[-2] in ("openai", "anthropic", "responses", "fim", "tools", "gateway"):
            named.update(re.findall(r"\"([RAPFT]\d{1,2})\"", path.read_text()))
    assert named and {rule_id for rule_id in named if lookup(rule_id) is None} == set()
