"""Claude Code-shaped requests (tests/corpus/anthropic/claude-code.jsonl, written by build.py) through a
real chatgate on default settings in front of the fake DeepSeek: each is forwarded unchanged (byte for byte),
repaired (and then accepted by the fake), or refused with the right code without reaching the fake. The
dry run and `chatgate lint` agree with the proxy on every one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from chatgate.cli import main
from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.harness import RunningChatgate, make_settings, run_chatgate

CORPUS = Path(__file__).with_name("claude-code.jsonl")
CASES = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningChatgate, RunningFake]]:
    tmp = tmp_path_factory.mktemp("cc")
    with run_fake_deepseek() as fake, run_chatgate(make_settings(tmp, fake.url)) as gate:
        yield gate, fake


def send(gate: RunningChatgate, case: dict[str, Any], path: str = "/anthropic/v1/messages?beta=true"
         ) -> tuple[httpx2.Response, bytes]:
    raw = json.dumps(case["body"]).encode()
    headers = {"content-type": "application/json", "x-api-key": "sk-claude-code-corpus",
               "anthropic-version": "2023-06-01", "anthropic-beta": case["anthropic_beta"],
               "user-agent": "claude-cli/2.1.170 (external, cli)", "x-app": "cli"}
    return httpx2.post(gate.url + path, content=raw, headers=headers, timeout=30), raw


def test_the_corpus_covers_what_the_issue_lists() -> None:
    expects = {c["expect"].split(":")[0] for c in CASES}
    assert expects == {"unchanged", "repaired", "refused"} and len(CASES) >= 15
    bodies = [c["body"] for c in CASES]
    assert any(len(b.get("tools", [])) >= 20 for b in bodies)
    assert any(b.get("thinking", {}).get("type") == "adaptive" for b in bodies)
    assert any("budget_tokens" in b.get("thinking", {}) for b in bodies)
    assert all("cache_control" in json.dumps(b["system"]) for b in bodies)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_each_claude_code_request(servers: tuple[RunningChatgate, RunningFake], case: dict[str, Any]) -> None:
    gate, fake = servers
    fake.state.wait_idle(5)
    fake.state.reset()
    resp, raw = send(gate, case)
    kind, _, detail = case["expect"].partition(":")
    fake.state.wait_idle(5)
    if kind == "refused":
        assert resp.status_code == 400, resp.text
        assert resp.json()["type"] == "error" and resp.json()["error"]["code"] == detail
        assert fake.state.requests == [], "refused locally: DeepSeek never saw it"
        return
    assert resp.status_code == 200, resp.text
    (forwarded,) = fake.state.requests
    assert forwarded.status == 200, forwarded.refused
    if kind == "unchanged":
        assert "x-chatgate-repaired" not in resp.headers
        assert forwarded.body == raw
    else:
        codes = {label.split("@")[0] for label in resp.headers["x-chatgate-repaired"].split("; ")}
        assert codes == set(detail.split(","))
        assert forwarded.body != raw


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_dry_run_and_lint_agree(servers: tuple[RunningChatgate, RunningFake], case: dict[str, Any],
                                    tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gate, _ = servers
    resp, _ = send(gate, case, "/anthropic/v1/messages/validate")
    kind, _, detail = case["expect"].partition(":")
    if kind == "refused":
        assert resp.status_code == 400 and resp.json()["error"]["code"] == detail
    else:
        assert resp.status_code == 200 and resp.json()["valid"] is True
    path = tmp_path / "body.json"
    path.write_text(json.dumps(case["body"]))
    code = main(["lint", "--format", "json", "--fix", str(path)])
    report = json.loads(capsys.readouterr().err)
    assert code == (1 if kind == "refused" else 0)
    codes = {p["code"] for r in report["results"] for p in r["problems"]}
    assert codes == ({detail} if kind == "refused" else set())
