"""DeepSeek's November 2026 requests (tests/corpus/november/november.jsonl, written by build.py) through a
real chatgate on default settings in front of the fake DeepSeek: every valid one is forwarded as sent and
answered (streamed or not), every invalid one is refused in its family's shape and never reaches DeepSeek.
What the rules alone make of the corpus on another tree: `python -m tests.corpus.november.measure`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from chatgate.demo.anthropic_rules import anthropic_error
from chatgate.demo.responses import responses_error
from chatgate.demo.rules import deepseek_error
from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.harness import RunningChatgate, make_settings, run_chatgate

CORPUS = Path(__file__).with_name("november.jsonl")
CASES = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]
KEY = "sk-november-corpus-0001"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningChatgate, RunningFake]]:
    tmp = tmp_path_factory.mktemp("november")
    with run_fake_deepseek() as fake, run_chatgate(make_settings(tmp, fake.url)) as gate:
        yield gate, fake


def raw(case: dict[str, Any]) -> bytes:
    return json.dumps(case["body"], ensure_ascii=False).encode()


def deepseek_says(case: dict[str, Any]) -> str | None:
    """The fake DeepSeek's own verdict on the body (its 400 message, or None)."""
    body = case["body"]
    if case["path"].startswith("/anthropic"):
        return anthropic_error(body)
    if case["path"].endswith("/responses"):
        return responses_error(body)
    return deepseek_error(case["path"], body)


def test_the_corpus_covers_the_november_surface() -> None:
    valid = [c for c in CASES if "refused" not in c]
    assert (len(valid), len(CASES) - len(valid)) == (17, 4)
    assert {c["path"] for c in valid} == {"/v1/chat/completions", "/anthropic/v1/messages", "/v1/responses"}
    text = json.dumps([c["body"] for c in valid], ensure_ascii=False)
    for needle in ("deepseek_web_search", "deepseek_read_url", '"title"', '"safety_check"', "latest_reminder",
                   "web_search_tool_result", "deepseek_web_search_call", "advisor_", "namespace",
                   "tool_search", "用户"):
        assert needle in text, needle
    assert len({c["name"] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_deepseek_accepts_the_valid_ones_and_refuses_the_others(case: dict[str, Any]) -> None:
    said = deepseek_says(case)
    if "refused" in case:
        assert said is not None
    else:
        assert said is None, said


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_each_request_through_chatgate(servers: tuple[RunningChatgate, RunningFake],
                                       case: dict[str, Any]) -> None:
    gate, fake = servers
    fake.state.wait_idle(5)
    fake.state.reset()
    body = raw(case)
    headers = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}
    resp = httpx2.post(gate.url + case["path"], content=body, headers=headers, timeout=30)
    if "refused" in case:
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["code"] == case["refused"]
        assert fake.state.requests == [], "a refused request reached DeepSeek"
        return
    assert resp.status_code == 200, resp.text
    assert "x-chatgate-repaired" not in resp.headers
    fake.state.wait_idle(5)
    (sent,) = fake.state.requests
    assert sent.body == body, "forwarded byte for byte"
    assert sent.refused is None and sent.status == 200
    if case["body"].get("stream"):
        assert resp.headers["content-type"].startswith("text/event-stream")
