"""Checking a large body does not stall everyone else (issue 34 §2): in managed mode the dry runs need a
client key (401 otherwise); a body over chatgate/gateway/checking.py's OFF_LOOP_BYTES is checked in a checker
process, on the forwarded routes and the dry runs alike, while /healthz and a live stream go on
(tests/stalls.py: the bound)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx2
import orjson
import pytest

from tests.fakes.server import RunningFake
from tests.harness import RunningChatgate
from tests.stalls import Beside

pytestmark = pytest.mark.slow  # multi-megabyte bodies, stalls measured (tests/stalls.py)

KEY = "sk-test-client-0001"


@pytest.mark.parametrize("path", ["/v1/chat/completions/validate", "/anthropic/v1/messages/validate",
                                  "/v1/responses/validate"])
def test_managed_dry_runs_need_a_client_key(start_gate: Callable[..., RunningChatgate], path: str) -> None:
    gate = start_gate(auth={"mode": "managed", "upstream_api_key": "sk-house"})
    body = {"model": "deepseek-flash", "max_tokens": 10, "input": "hi",
            "messages": [{"role": "user", "content": "hi"}]}
    for headers in ({}, {"authorization": "Bearer cg-unknown"}, {"x-api-key": "cg-unknown"}):
        resp = httpx2.post(gate.url + path, json=body, headers=headers, timeout=20)
        assert resp.status_code == 401, (headers, resp.text)


def responses_body(items: int) -> bytes:
    item = {"type": "message", "role": "user", "content": "hello there, hello there, hello there"}
    return orjson.dumps({"model": "deepseek-flash", "input": [item] * items})


def chat_body(messages: int) -> bytes:
    pair = [{"role": "user", "content": "hi hi hi hi"}, {"role": "assistant", "content": "ok ok ok ok"}]
    return orjson.dumps({"model": "deepseek-flash", "messages": [*pair * (messages // 2),
                                                                 # a role DeepSeek refuses (an unknown one
                                                                 # is forwarded: R5)
                                                                 {"role": "developer", "content": "x"}]})


def test_large_bodies_are_checked_beside_other_requests(gate: RunningChatgate, fake: RunningFake) -> None:
    attacks: list[tuple[str, bytes, int]] = [
        ("/v1/responses/validate", responses_body(250_000), 200),
        ("/v1/responses/validate", responses_body(250_000), 200),
        ("/v1/chat/completions", chat_body(250_000), 400),  # refused by R5 after the whole check
    ]
    answers: dict[int, int] = {}

    def attack(i: int, path: str, body: bytes) -> None:
        answers[i] = httpx2.post(gate.url + path, content=body, timeout=300, headers={
            "authorization": f"Bearer {KEY}", "content-type": "application/json"}).status_code

    attack(-1, "/v1/responses/validate", responses_body(30_000))  # the checkers start (not measured)
    assert answers.pop(-1) == 200
    with Beside(gate.url) as beside:
        threads = [threading.Thread(target=attack, args=(i, path, body))
                   for i, (path, body, _) in enumerate(attacks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    assert answers == {i: status for i, (_, _, status) in enumerate(attacks)}
    print(beside.report(), [len(b) >> 20 for _, b, _ in attacks], "MB")
    beside.assert_unstalled()
    assert not [r for r in fake.state.requests if r.path != "/chat/completions" or
                b"stream beside an attack" not in r.body], "only the measuring streams reached DeepSeek"


def test_an_ordinary_body_is_checked_as_before(gate: RunningChatgate, fake: RunningFake) -> None:
    body: dict[str, Any] = {"model": "deepseek-flash", "messages": [{"role": "user", "content": "hi"}]}
    resp = httpx2.post(gate.url + "/v1/chat/completions/validate", json=body,
                       headers={"authorization": f"Bearer {KEY}"})
    assert resp.status_code == 200 and resp.json()["valid"] is True


def test_a_growing_body_starts_the_checkers_before_one_needs_them(gate: RunningChatgate,
                                                                  fake: RunningFake) -> None:
    from chatgate.gateway.checking import OFF_LOOP_BYTES, WARM_BYTES

    checkers = gate.app.state.chatgate.gw.checkers
    small = {"model": "deepseek-flash", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx2.post(gate.url + "/v1/chat/completions", json=small, timeout=30,
                       headers={"authorization": f"Bearer {KEY}"}).status_code == 200
    assert checkers._pool is None, "ordinary bodies start no process"
    words = "a growing conversation " * (WARM_BYTES // 20)
    body = {"model": "deepseek-flash", "messages": [{"role": "user", "content": words}]}
    assert WARM_BYTES < len(orjson.dumps(body)) <= OFF_LOOP_BYTES
    resp = httpx2.post(gate.url + "/v1/chat/completions", json=body, timeout=30,
                       headers={"authorization": f"Bearer {KEY}"})
    assert resp.status_code == 200, resp.text  # checked here, as before
    pool = checkers._pool
    assert pool is not None and pool._processes, "the checker processes are starting"
    assert pool.submit(sum, [1, 2]).result(timeout=60) == 3
