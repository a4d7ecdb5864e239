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
