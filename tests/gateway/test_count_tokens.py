"""count_tokens cannot freeze the proxy (issue 34 §1): a large count runs with the interpreter lock released
while /healthz and a live stream go on (tests/stalls.py: the bound), its memory is bounded, a count over
limits.count_tokens_exact_bytes answers an upper bound and says so, and the key's rate limits apply. The
estimate of a stream that ended without usage counts the same way."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest

from tests.fakes.server import RunningFake
from tests.gateway.conftest import _read_usage
from tests.harness import RunningChatgate
from tests.quotas.support import key_subject, set_limits
from tests.stalls import Beside

pytestmark = pytest.mark.slow  # large bodies, stalls measured (tests/stalls.py)

KEY = "sk-test-client-0001"
PATH = "/anthropic/v1/messages/count_tokens"
HEADERS = {"x-api-key": KEY, "content-type": "application/json"}


def big_messages(mb: float) -> dict[str, Any]:
    words = "the quick brown fox jumps over the lazy dog, and then some more words; "
    text = words * int(mb * 1024 * 1024 / len(words))
    return {"model": "deepseek-flash", "max_tokens": 10, "messages": [{"role": "user", "content": text}]}


@pytest.fixture
def gate(start_gate: Callable[..., RunningChatgate]) -> RunningChatgate:
    return start_gate()


def test_a_large_count_does_not_stall_other_requests(gate: RunningChatgate, fake: RunningFake) -> None:
    body = big_messages(3.5)  # under the exact limit: counted exactly (about 9 s of lock held, before)
    answers: list[httpx2.Response] = []
    with Beside(gate.url) as beside:
        attack = threading.Thread(target=lambda: answers.append(
            httpx2.post(gate.url + PATH, json=body, headers=HEADERS, timeout=300)))
        attack.start()
        attack.join(300)
    assert answers and answers[0].status_code == 200, answers
    counted = answers[0].json()["input_tokens"]
    assert 500_000 < counted < 3.5 * 1024 * 1024, counted
    assert "x-chatgate-warning" not in answers[0].headers
    print(beside.report())
    beside.assert_unstalled()
    assert beside.memory_gained < 400 << 20, beside.report()  # before: 3.2 GB for 20 MB, ~600 MB for this


def many_messages(mb: float) -> bytes:
    pair = [{"role": "user", "content": "hi hi hi hi hi"}, {"role": "assistant", "content": "ok ok ok"}]
    return orjson.dumps({"model": "deepseek-flash", "max_tokens": 10,
                         "messages": pair * int(mb * 1024 * 1024 / 120)})


def rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_a_huge_count_costs_bounded_memory_and_gives_it_back(gate: RunningChatgate, fake: RunningFake
                                                              ) -> None:
    """A 28 MB body of 470,000 messages (the parse is what costs: its text, 13 MB, is over the exact limit).
    Before, a checker process kept R1's parse of its last body (a thread-local) and glibc's freed heap:
    +250 MB after such a count, growing with each larger one; the server gained the text sent back."""
    warm = httpx2.post(gate.url + PATH, content=many_messages(2), headers=HEADERS, timeout=60)
    assert warm.status_code == 200, warm.text  # the checkers start (not measured)
    pool = gate.state.gw.checkers._pool
    pids = list(pool._processes)
    before = {pid: rss_of(pid) for pid in pids}
    with Beside(gate.url) as beside:
        resp = httpx2.post(gate.url + PATH, content=many_messages(28), headers=HEADERS, timeout=300)
    assert resp.status_code == 200, resp.text
    assert "upper bound" in resp.headers["x-chatgate-warning"]
    kept = {pid: (rss_of(pid) - before[pid]) >> 20 for pid in pids}
    print(beside.report(), "checkers kept (MB):", kept)
    assert all(mb < 64 for mb in kept.values()), kept
    assert beside.memory_gained < 300 << 20, beside.report()
    beside.assert_unstalled()


def test_a_count_over_the_body_limit_is_413(start_gate: Callable[..., RunningChatgate], fake: RunningFake
                                            ) -> None:
    gate = start_gate(limits={"max_body_bytes": 1 << 20})
    resp = httpx2.post(gate.url + PATH, content=many_messages(2), headers=HEADERS, timeout=60)
    assert resp.status_code == 413, resp.text
    assert resp.json()["type"] == "error" and resp.json()["error"]["code"] == "request_too_large"
    assert "limits.max_body_bytes" in resp.json()["error"]["message"]


def test_above_the_exact_limit_the_answer_is_an_upper_bound(start_gate: Callable[..., RunningChatgate],
                                                            fake: RunningFake) -> None:
    gate = start_gate(limits={"count_tokens_exact_bytes": 10_000})
    small = httpx2.post(gate.url + PATH, json=big_messages(0.005), headers=HEADERS, timeout=60)
    assert small.status_code == 200 and "x-chatgate-warning" not in small.headers
    body = big_messages(0.5)
    text = body["messages"][0]["content"]
    resp = httpx2.post(gate.url + PATH, json=body, headers=HEADERS, timeout=60)
    assert resp.status_code == 200, resp.text
    assert resp.json()["input_tokens"] >= len(text.encode()), "every token is at least a byte"
    assert "upper bound" in resp.headers["x-chatgate-warning"]


def test_the_keys_rate_limit_applies_to_counts(gate: RunningChatgate, fake: RunningFake, tmp_path: Path
                                               ) -> None:
    set_limits(f"sqlite:///{tmp_path}/usage.db", "key", key_subject(KEY), rpm=1)
    body = big_messages(0.001)
    first = httpx2.post(gate.url + PATH, json=body, headers=HEADERS, timeout=60)
    second = httpx2.post(gate.url + PATH, json=body, headers=HEADERS, timeout=60)
    assert first.status_code == 200, first.text
    assert second.status_code == 429, second.text
    assert second.json()["type"] == "error", "the Anthropic shape"
    assert "retry-after" in second.headers


def test_counting_a_stream_that_ended_without_usage_does_not_stall(gate: RunningChatgate, fake: RunningFake,
                                                                   tmp_path: Path) -> None:
    body = {"model": "deepseek-flash", "stream": True, **big_messages(3.5)}
    headers = {"authorization": f"Bearer {KEY}", "x-fake-chunk-delay": "0.5"}
    with Beside(gate.url) as beside:
        for _ in range(2):  # the client hangs up after the headers: chatgate counts the prompt
            with httpx2.stream("POST", gate.url + "/v1/chat/completions", json=body, timeout=120,
                               headers=headers) as resp:
                assert resp.status_code == 200
        deadline = time.monotonic() + 120
        while len(estimated(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
    assert len(estimated(tmp_path)) == 2
    print(beside.report())
    beside.assert_unstalled()


def estimated(tmp_path: Path) -> list[dict[str, Any]]:
    return [r for r in _read_usage(tmp_path / "usage.db") if r["prompt_tokens"] > 500_000]
