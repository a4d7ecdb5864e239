"""The corpus of what real clients send (tests/corpus/*.jsonl, written by `python -m tests.corpus.capture`):
the regression net for false alarms.

Every body DeepSeek (the fake) accepted must be valid for chatgate's rules, and its three faces must agree on
it: `check_body`, the dry run (`POST /v1/chat/completions/validate` on a running chatgate) and `chatgate lint`
(valid, same warnings). The bodies DeepSeek refused (tests/corpus/invalid/) are refused by all three with the
rule the capture recorded.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

from chatgate.cli import main as chatgate_cli
from chatgate.openai.rules import Checked, check_body
from chatgate.rules.models import Policy
from tests.compat.zoo.model import CLIENTS
from tests.corpus.capture import CORPUS, INVALID, split_line
from tests.harness import make_settings, run_chatgate

VALID_FILES = sorted(CORPUS.glob("*.jsonl"))
INVALID_FILES = sorted(INVALID.glob("*.jsonl"))
KEY = "sk-corpus-0001"


@dataclass(frozen=True)
class Entry:
    file: Path
    line: int
    meta: dict[str, Any]
    raw: bytes  # the request body exactly as the client sent it

    @property
    def where(self) -> str:
        return f"{self.file.name}:{self.line} ({self.meta['custom_id']})"

    @property
    def beta(self) -> bool:
        return "/beta/" in self.meta["url"]


def entries(path: Path) -> list[Entry]:
    found = []
    for n, line in enumerate(path.read_bytes().splitlines(), 1):
        if line.strip():
            meta, raw = split_line(line)
            assert json.loads(line)["body"] == json.loads(raw), f"{path.name}:{n}: body and raw differ"
            found.append(Entry(path, n, meta, raw))
    return found


def all_entries(files: list[Path]) -> Iterator[Entry]:
    for path in files:
        yield from entries(path)


def problems(checked: Checked) -> list[dict[str, Any]]:
    return [p.as_dict() for p in checked.problems]


def warnings(checked: Checked) -> list[dict[str, Any]]:
    return [w.as_dict() for w in checked.warnings]


def lint(path: Path) -> list[dict[str, Any]]:
    """`chatgate lint --format json FILE`: one result per line, in order."""
    out = io.StringIO()
    with redirect_stdout(out):
        chatgate_cli(["lint", "--format", "json", str(path)])
    results: list[dict[str, Any]] = json.loads(out.getvalue())["results"]
    return results


@pytest.fixture(scope="module")
def gate_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A chatgate on default settings for the dry runs (nothing is forwarded: the upstream is unreachable)."""
    with run_chatgate(make_settings(tmp_path_factory.mktemp("corpus"))) as gate:
        yield gate.url


def dry_run(gate_url: str, entry: Entry) -> httpx2.Response:
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    return httpx2.post(gate_url + "/v1/chat/completions/validate", content=entry.raw, headers=headers,
                       timeout=10)


def test_corpus_is_a_real_net() -> None:
    valid = list(all_entries(VALID_FILES))
    assert len(valid) >= 50 and len({e.raw for e in valid}) >= 50
    assert {f.stem for f in VALID_FILES} == set(CLIENTS)  # every zoo client contributed
    custom_ids = [e.meta["custom_id"] for e in [*valid, *all_entries(INVALID_FILES)]]
    assert len(custom_ids) == len(set(custom_ids))


@pytest.mark.parametrize("path", VALID_FILES, ids=lambda p: p.stem)
def test_corpus_bodies_are_valid_and_checks_dry_run_and_lint_agree(path: Path, gate_url: str) -> None:
    linted = lint(path)
    bodies = entries(path)
    assert len(linted) == len(bodies)
    false_alarms, disagreements = [], []
    for entry, linted_one in zip(bodies, linted, strict=True):
        checked = check_body(entry.raw, Policy(), beta=entry.beta)
        if checked.problems:
            false_alarms.append(f"{entry.where}: {problems(checked)}")
            continue
        reply = dry_run(gate_url, entry)
        online = check_body(entry.raw, Policy(), beta=entry.beta, origin=gate_url)  # hints name the address
        if reply.status_code != 200 or reply.json().get("warnings") != warnings(online):
            disagreements.append(f"{entry.where}: /validate {reply.status_code} {reply.text}")
        if not linted_one["valid"] or linted_one["warnings"] != warnings(checked):
            disagreements.append(f"{entry.where}: lint {linted_one}")
    assert false_alarms == [], "chatgate refuses bodies DeepSeek accepts"
    assert disagreements == []


@pytest.mark.parametrize("path", INVALID_FILES, ids=lambda p: p.stem)
def test_corpus_refused_bodies_are_refused_by_all_three_with_their_rule(path: Path, gate_url: str) -> None:
    linted = lint(path)
    bodies = entries(path)
    assert bodies and len(linted) == len(bodies)
    for entry, linted_one in zip(bodies, linted, strict=True):
        expect = entry.meta["expect"]
        first = {"code": expect["code"], "param": expect["param"], "rule": expect["rule"]}
        checked = check_body(entry.raw, Policy(), beta=entry.beta)
        assert checked.problems, entry.where
        assert {k: problems(checked)[0][k] for k in first} == first, entry.where
        reply = dry_run(gate_url, entry)
        assert reply.status_code == 400, entry.where
        error = reply.json()["error"]
        assert {k: error["problems"][0][k] for k in first} == first, entry.where
        assert (error["code"], error["param"]) == (expect["code"], expect["param"]), entry.where
        assert not linted_one["valid"], entry.where
        assert {k: linted_one["problems"][0][k] for k in first} == first, entry.where
