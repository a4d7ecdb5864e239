"""Codex-shaped requests (tests/corpus/codex/codex.jsonl, written by build.py) through a real chatgate on
default settings in front of the fake DeepSeek, with Codex's headers: each is forwarded unchanged (byte for
byte, headers included), repaired (and then accepted by the fake), refused with the right code without
reaching the fake, or forwarded with a warning and answered by DeepSeek itself. The dry run agrees."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from chatgate.demo.responses import responses_error
from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.harness import RunningChatgate, make_settings, run_chatgate

CORPUS = Path(__file__).with_name("codex.jsonl")
CASES = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]
KEY = "sk-codex-corpus-0001"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningChatgate, RunningFake]]:
    tmp = tmp_path_factory.mktemp("codex")
    with run_fake_deepseek() as fake, run_chatgate(make_settings(tmp, fake.url)) as gate:
        yield gate, fake


def send(gate: RunningChatgate, case: dict[str, Any], path: str = "/v1/responses"
         ) -> tuple[httpx2.Response, bytes]:
    raw = json.dumps(case["body"]).encode()
    headers = {"content-type": "application/json", "authorization": f"Bearer {KEY}", **case["headers"]}
    return httpx2.post(gate.url + path, content=raw, headers=headers, timeout=30), raw


def test_the_corpus_covers_what_the_issue_lists() -> None:
    assert {c["expect"].split(":")[0] for c in CASES} == {"unchanged", "repaired", "refused"}
    assert len(CASES) >= 20
    bodies = [c["body"] for c in CASES]
    assert all(b["store"] is False and b["include"] == ["reasoning.encrypted_content"] for b in bodies)
    assert all(b.get("prompt_cache_key") for b in bodies)
    assert all(any(t.get("name") == "apply_patch" for t in b["tools"]) for b in bodies)
    assert all(any(t["type"] == "web_search" for t in b["tools"]) for b in bodies)
    assert any(len(b["input"]) > 100 and sum(i.get("type") == "reasoning" for i in b["input"]) > 30
               for b in bodies)
    assert all(c["headers"]["user-agent"].startswith("codex_cli_rs/") and c["headers"]["originator"]
               and c["headers"]["session_id"] for c in CASES)
    assert any("x-openai-subagent" in c["headers"] for c in CASES)
    names = {c["name"] for c in CASES}
    assert {"hook-message-between-call-and-output", "heartbeat-without-call-id",
            "orphan-automation-output"} <= names


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_each_codex_request(servers: tuple[RunningChatgate, RunningFake], case: dict[str, Any]) -> None:
    gate, fake = servers
    fake.state.wait_idle(5)
    fake.state.reset()
    resp, raw = send(gate, case)
    kind, _, detail = case["expect"].partition(":")
    fake.state.wait_idle(5)
    assert ("x-chatgate-warning" in resp.headers) == bool(case.get("warns")), "the dry run names the rules"
    if kind == "refused":
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["code"] == detail and error["param"] and error["problems"][0]["rule"].startswith("P")
        assert fake.state.requests == [], "refused locally: DeepSeek never saw it"
        assert responses_error(case["body"]) is not None, "DeepSeek would have refused it too"
        return
    (forwarded,) = fake.state.requests
    assert {k: forwarded.headers.get(k) for k in case["headers"] if k != "accept"} == {
        k: v for k, v in case["headers"].items() if k != "accept"}, "Codex's headers reach DeepSeek"
    if kind == "deepseek":
        assert resp.status_code == int(detail) and forwarded.body == raw
        assert "The supported API model names are" in resp.json()["error"]["message"]
        return
    assert resp.status_code == 200, resp.text
    assert forwarded.status == 200, forwarded.refused
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.content.rstrip().split(b"\n\n")[-1].startswith(b"event: response.completed")
    if kind == "unchanged":
        assert "x-chatgate-repaired" not in resp.headers
        assert forwarded.body == raw
    else:
        codes = {label.split("@")[0] for label in resp.headers["x-chatgate-repaired"].split("; ")}
        assert codes == set(detail.split(","))
        assert forwarded.body != raw
        assert responses_error(case["body"]) is not None, "DeepSeek would have refused it unrepaired"


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_dry_run_agrees(servers: tuple[RunningChatgate, RunningFake], case: dict[str, Any]) -> None:
    gate, fake = servers
    before = len(fake.state.requests)
    resp, _ = send(gate, case, "/v1/responses/validate")
    kind, _, detail = case["expect"].partition(":")
    if kind == "refused":
        assert resp.status_code == 400 and resp.json()["error"]["code"] == detail
    else:
        answer = resp.json()
        assert resp.status_code == 200 and answer["valid"] is True
        assert {w["rule"] for w in answer["warnings"]} == set(case.get("warns", []))
        assert {r["code"] for r in answer.get("repairs", [])} == (set(detail.split(",")) if kind == "repaired"
                                                                  else set())
    assert len(fake.state.requests) == before
