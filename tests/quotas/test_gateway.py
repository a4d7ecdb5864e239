"""Limits end to end on one replica (issue 15): chatgate on a loopback port in front of the fake DeepSeek,
the openai SDK as the client, limits written to the store as `chatgate keys set` / the admin API write them.

What a client sees: a 429 the SDK raises as RateLimitError, with OpenAI's x-ratelimit-* headers and
Retry-After for rates, `insufficient_quota` with x-should-retry: false for budgets (the SDK does not retry
it), and nothing refused ever reaches DeepSeek or goes unrecorded."""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest

from chatgate.quotas.gate import money_text as usd_text
from tests.fakes.server import RunningFake
from tests.harness import ADMIN_KEY, RunningChatgate, make_settings, run_chatgate
from tests.quotas.support import ask, client, key_subject, set_limits, usd, webhook_receiver

pytestmark = pytest.mark.slow  # limits waited out in real time


def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/usage.db"


def records(tmp_path: Path, count: int, timeout: float = 10) -> list[dict[str, Any]]:
    """The usage rows, once there are `count` of them (the recorder writes off the hot path)."""
    deadline = time.monotonic() + timeout
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        conn = sqlite3.connect(tmp_path / "usage.db")
        conn.row_factory = sqlite3.Row
        try:
            rows = [dict(r) for r in conn.execute("SELECT * FROM usage ORDER BY ts")]
        except sqlite3.OperationalError:
            rows = []
        finally:
            conn.close()
        if len(rows) >= count:
            break
        time.sleep(0.05)
    assert len(rows) == count, [(r["outcome"], r["rule_code"]) for r in rows]
    return rows


def chat_requests(fake: RunningFake) -> int:
    return sum(1 for r in fake.state.requests if r.path.endswith("/chat/completions"))


# --- rates -------------------------------------------------------------------------------------------------


def test_rpm_refuses_the_request_over_the_limit_with_openai_headers(
        tmp_path: Path, start: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    gate = start()
    secret = "sk-rpm-caller-0001"
    set_limits(store_url(tmp_path), "key", key_subject(secret), rpm=2)
    first = ask(gate.url, secret, 1)
    assert first.http_response.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    second = ask(gate.url, secret, 2)
    assert second.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(openai.RateLimitError) as caught:
        ask(gate.url, secret, 3)
    err = caught.value
    assert err.status_code == 429 and err.code == "rate_limit_exceeded"
    assert err.body["type"] == "requests" and "2 requests per minute" in err.message  # type: ignore[index]
    retry_after = int(err.response.headers["retry-after"])
    assert 1 <= retry_after <= 61
    assert err.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert err.response.headers["x-ratelimit-limit-requests"] == "2"
    assert chat_requests(fake) == 2, "the refused request never reached DeepSeek"
    # another caller is not limited by this key's rpm
    assert ask(gate.url, "sk-other-caller-0002", 4).http_response.status_code == 200
    rows = records(tmp_path, 4)
    limited = [r for r in rows if r["outcome"] == "limited"]
    assert len(limited) == 1 and limited[0]["rule_code"] == "rpm:key" and limited[0]["cost_picousd"] == 0
    assert limited[0]["key_id"] == key_subject(secret)


def test_a_team_limit_is_shared_by_every_key_of_the_team(
        tmp_path: Path, start: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    gate = start(auth={"passthrough_team": "platform"})
    set_limits(store_url(tmp_path), "team", "platform", rpm=3)
    for n, secret in enumerate(["sk-team-a-0001", "sk-team-b-0002", "sk-team-c-0003"]):
        assert ask(gate.url, secret, n).http_response.status_code == 200
    with pytest.raises(openai.RateLimitError) as caught:
        ask(gate.url, "sk-team-d-0004", 9)
    assert "team platform" in caught.value.message
    assert records(tmp_path, 4)[-1]["rule_code"] == "rpm:team"


def test_tpm_reserves_prompt_and_max_tokens_then_counts_what_was_used(
        tmp_path: Path, start: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    gate = start()
    secret = "sk-tpm-caller-0004"
    set_limits(store_url(tmp_path), "key", key_subject(secret), tpm=3000)
    # a request that could never fit: waiting cannot help, so no Retry-After and the SDK must not retry
    with pytest.raises(openai.RateLimitError) as caught:
        client(gate.url, secret, max_retries=2).chat.completions.create(
            model="deepseek-flash", messages=[{"role": "user", "content": "hi"}], max_tokens=5000)
    err = caught.value
    assert err.body["type"] == "tokens" and "lower max_tokens" in err.message  # type: ignore[index]
    assert "retry-after" not in err.response.headers and err.response.headers["x-should-retry"] == "false"
    # each reserves ~1.1k of the 3k, but settles to the few dozen tokens it used: ten in a row all fit
    for n in range(10):
        resp = ask(gate.url, secret, n, max_tokens=1000)
        assert resp.http_response.status_code == 200
        remaining = int(resp.headers["x-ratelimit-remaining-tokens"])
        assert remaining < 3000 - 1000
    assert chat_requests(fake) == 10
    rows = records(tmp_path, 11)
    assert sum(1 for r in rows if r["outcome"] == "limited") == 1


def test_concurrency_limit_counts_requests_in_flight_streams_included(
        tmp_path: Path, start: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    gate = start()
    secret = "sk-concurrent-0005"
    set_limits(store_url(tmp_path), "key", key_subject(secret), max_concurrent=1)
    sdk = client(gate.url, secret)
    stream = sdk.chat.completions.create(
        model="deepseek-flash", messages=[{"role": "user", "content": "tell me"}], stream=True,
        extra_headers={"x-fake-chunk-delay": "0.3"})
    chunks = iter(stream)
    next(chunks)  # the stream is open and in flight
    with pytest.raises(openai.RateLimitError) as caught:
        ask(gate.url, secret, 1)
    assert "in flight" in caught.value.message and caught.value.response.headers["retry-after"] == "1"
    rest = list(chunks)
    assert any(c.choices and c.choices[0].finish_reason == "stop" for c in rest)
    deadline = time.monotonic() + 5  # the stream's end releases its place as soon as it is recorded
    while True:
        try:
            assert ask(gate.url, secret, 2).http_response.status_code == 200
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline, "the ended stream still counted as in flight"
            time.sleep(0.05)


def test_a_client_that_disconnects_gives_its_place_back(
        tmp_path: Path, start: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    gate = start()
    secret = "sk-disconnect-0006"
    set_limits(store_url(tmp_path), "key", key_subject(secret), max_concurrent=1)
    body = {"model": "deepseek-flash", "messages": [{"role": "user", "content": "long"}], "stream": True}
    headers = {"authorization": f"Bearer {secret}", "x-fake-chunk-delay": "0.5"}
    with httpx2.stream("POST", gate.url + "/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status_code == 200
        next(resp.iter_bytes())
    deadline = time.monotonic() + 10
    while True:
        try:
            assert ask(gate.url, secret, 1).http_response.status_code == 200
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline, "an abandoned stream kept its concurrency place"
            time.sleep(0.1)


class _FailingTransport(httpx2.AsyncBaseTransport):
    """A fault inside chatgate itself (not DeepSeek's): what a bug below the gateway would raise."""

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        raise RuntimeError("a bug below the gateway")


@pytest.mark.parametrize(("cause", "status", "outcome"), [
    ("bad_gzip_200", 502, "upstream_failed"),  # DeepSeek says gzip, sends garbage: httpx2's DecodingError
    ("internal", 500, "aborted"),
])  # fmt: skip
def test_a_request_that_fails_inside_chatgate_is_recorded_and_gives_its_place_back(
        tmp_path: Path, fake: RunningFake, cause: str, status: int, outcome: str) -> None:
    secret = "sk-failing-0007"
    set_limits(store_url(tmp_path), "key", key_subject(secret), max_concurrent=1)
    settings = make_settings(tmp_path, fake.url, limits={"cache_seconds": 0})
    transport = _FailingTransport() if cause == "internal" else None
    with run_chatgate(settings, transport=transport) as gate:
        for n in range(3):  # with max_concurrent=1, a place kept by a failed request refuses the next one
            with pytest.raises(openai.APIStatusError) as caught:
                ask(gate.url, secret, n, extra_headers={"x-fake-fault": cause})
            assert caught.value.status_code == status, caught.value.message
    rows = records(tmp_path, 3)
    assert [(r["outcome"], r["key_id"]) for r in rows] == [(outcome, key_subject(secret))] * 3


# --- budgets -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("budgets", ["local", "store"])
def test_budget_refuses_with_insufficient_quota_and_is_never_overspent(
        tmp_path: Path, start: Callable[..., RunningChatgate], fake: RunningFake, budgets: str) -> None:
    gate = start(limits={"budgets": budgets})
    secret = "sk-budget-caller-0007"
    budget = usd("0.0004")
    set_limits(store_url(tmp_path), "key", key_subject(secret), budget_picousd=budget, budget_period="day")
    ok = 0
    while ok < 200:
        try:
            ask(gate.url, secret, ok, max_tokens=32)
        except openai.RateLimitError as err:
            refused = err
            break
        ok += 1
    else:
        pytest.fail("the budget never ran out")
    assert ok >= 3, "a budget of several requests admitted fewer"
    assert refused.code == "insufficient_quota" and refused.body["type"] == "insufficient_quota"  # type: ignore[index]
    assert refused.response.headers["x-should-retry"] == "false"
    assert "budget" in refused.message
    # the SDK's default retries do not retry it: one refused request reached chatgate
    rows = records(tmp_path, ok + 1)
    spent = sum(r["cost_picousd"] for r in rows)
    assert 0 < spent <= budget
    assert [r["rule_code"] for r in rows if r["outcome"] == "limited"] == ["budget:key"]
    with pytest.raises(openai.RateLimitError):  # the refused request again: nothing has changed since
        client(gate.url, secret, max_retries=2).chat.completions.create(
            model="deepseek-flash", messages=[{"role": "user", "content": f"Question {ok}: what is 2 + 2?"}],
            max_tokens=32)
    assert len(records(tmp_path, ok + 2)) == ok + 2, "the SDK retried an insufficient_quota"
    assert chat_requests(fake) == ok


def test_a_day_budget_starts_over_the_next_day(
        tmp_path: Path, start: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    gate = start()
    secret = "sk-rollover-0008"
    set_limits(store_url(tmp_path), "key", key_subject(secret), budget_picousd=usd("0.00015"),
               budget_period="day")
    sent = 0
    with pytest.raises(openai.RateLimitError):
        while sent < 100:
            ask(gate.url, secret, sent, max_tokens=32)
            sent += 1
    quotas, gateway = gate.state.quotas, gate.state.gw
    real = quotas.clock
    quotas.clock = gateway.clock = lambda: real() + 86400  # a request starts tomorrow, and is admitted then
    assert ask(gate.url, secret, 99, max_tokens=32).http_response.status_code == 200
    quotas.clock = gateway.clock = real
    with pytest.raises(openai.RateLimitError):  # back on today: still spent
        ask(gate.url, secret, 100, max_tokens=32)


def test_a_budget_too_small_for_one_request_says_so(
        tmp_path: Path, start: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    gate = start()
    secret = "sk-tiny-budget-0009"
    set_limits(store_url(tmp_path), "key", key_subject(secret), budget_picousd=usd("0.000001"),
               budget_period="month")
    with pytest.raises(openai.RateLimitError) as caught:
        ask(gate.url, secret, 1, max_tokens=100)
    assert caught.value.code == "insufficient_quota"
    assert chat_requests(fake) == 0


@pytest.mark.parametrize("budgets", ["local", "store"])
def test_a_budget_refusal_names_the_reservation_the_spend_and_max_tokens(
        tmp_path: Path, start: Callable[..., RunningChatgate], fake: RunningFake, budgets: str) -> None:
    """Issue 50 §2: a request without max_tokens reserves the default output (32,768 tokens); its 429 says
    so, with the budget's spend and what is left, in amounts below a cent that are not printed as $0.00."""
    gate = start(limits={"budgets": budgets})
    secret = "sk-budget-message-0012"
    set_limits(store_url(tmp_path), "key", key_subject(secret), budget_picousd=usd("0.0001"),
               budget_period="month")
    assert ask(gate.url, secret, 1, max_tokens=8).http_response.status_code == 200  # fits
    spent = records(tmp_path, 1)[0]["cost_picousd"]
    assert 0 < spent < usd("0.0001")
    with pytest.raises(openai.RateLimitError) as caught:
        ask(gate.url, secret, 2, max_tokens=None)
    message = caught.value.message
    assert "The month budget of key fp-" in message and "($0.0001)" in message
    assert "$0.00)" not in message and "$0.00 " not in message
    spent_text = usd_text(spent)
    assert f"has {usd_text(usd('0.0001') - spent)} left: spent {spent_text} (" in message
    assert f"({100 * spent / usd('0.0001'):.1f}% used)" in message
    assert "32,768 output tokens (no max_tokens was sent: the default, limits.default_max_tokens)" in message
    assert "Set max_tokens" in message
    reserve = re.search(r"would reserve up to (\$[0-9.]+)", message)
    assert reserve is not None and reserve.group(1) in message.split("The reservation:")[1]
    assert caught.value.code == "insufficient_quota"

    with pytest.raises(openai.RateLimitError) as bounded:  # with max_tokens: its own, and no advice to set it
        ask(gate.url, secret, 3, max_tokens=4000)
    assert "4,000 output tokens (its max_tokens)" in bounded.value.message
    assert "Set max_tokens" not in bounded.value.message
    assert chat_requests(fake) == 1


@pytest.mark.parametrize(("picousd", "text"), [
    (0, "$0.00"), (usd("0.0001"), "$0.0001"), (usd("0.000097"), "$0.000097"), (usd("50"), "$50.00"),
    (usd("12.5"), "$12.50"), (usd("0.009216"), "$0.009216"), (usd("0.5"), "$0.50"), (usd("0.015"), "$0.015"),
    (usd("1234.567"), "$1234.57"), (usd("0.00001234567"), "$0.00001235"),
])
def test_amounts_below_a_cent_keep_their_digits(picousd: int, text: str) -> None:
    assert usd_text(picousd) == text


def test_budget_alerts_fire_once_each_at_the_soft_threshold_and_when_spent(
        tmp_path: Path, start: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    with webhook_receiver(fail_first=1) as hook:  # the first delivery fails and is retried
        gate = start(alerts={"webhook_url": hook.url, "soft_percent": 50, "retries": 3})
        secret = "sk-alerted-0010"
        set_limits(store_url(tmp_path), "key", key_subject(secret), budget_picousd=usd("0.0003"),
                   budget_period="week")
        sent = 0
        with pytest.raises(openai.RateLimitError):
            while sent < 200:
                ask(gate.url, secret, sent, max_tokens=32)
                sent += 1
        for _ in range(3):  # more refusals and spending send nothing more
            with pytest.raises(openai.RateLimitError):
                ask(gate.url, secret, 0, max_tokens=32)
        received = hook.wait(2)
        time.sleep(0.5)
        assert len(hook.received) == 2, hook.received
    by_level = {event["level"]: event for event in received}
    assert set(by_level) == {"soft", "hard"}
    soft = by_level["soft"]
    assert soft["event"] == "budget_alert" and soft["scope"] == "key"
    assert soft["subject"] == key_subject(secret) and soft["period"] == "week"
    assert soft["budget_usd"] == pytest.approx(0.0003) and 50 <= soft["percent"] < 100
    hard = by_level["hard"]  # sent when a request was refused: it reports what was really spent
    assert soft["spent_usd"] <= hard["spent_usd"] <= 0.0003 and hard["percent"] == pytest.approx(
        100 * hard["spent_usd"] / 0.0003, abs=0.01)


def test_limits_changed_in_the_store_apply_within_the_cache_delay(
        tmp_path: Path, start: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    gate = start(limits={"cache_seconds": 0.5})
    secret = "sk-cached-0011"
    for n in range(3):
        assert ask(gate.url, secret, n).http_response.status_code == 200
    set_limits(store_url(tmp_path), "key", key_subject(secret), rpm=1)
    changed = time.monotonic()
    while True:
        try:
            ask(gate.url, secret, 9)
        except openai.RateLimitError:
            break
        assert time.monotonic() - changed < 3, "a new limit did not apply within the cache delay"
        time.sleep(0.05)


def test_many_concurrent_callers_never_exceed_a_budget(
        tmp_path: Path, start: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    gate = start()
    secret = "sk-crowd-0012"
    budget = usd("0.0006")
    set_limits(store_url(tmp_path), "key", key_subject(secret), budget_picousd=budget, budget_period="total")
    outcomes: list[int] = []
    lock = threading.Lock()

    def one(n: int) -> None:
        try:
            status = ask(gate.url, secret, n, max_tokens=32).http_response.status_code
        except openai.RateLimitError:
            status = 429
        with lock:
            outcomes.append(status)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(60)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(outcomes) <= {200, 429} and 200 in outcomes and 429 in outcomes
    rows = records(tmp_path, 60)
    assert sum(r["cost_picousd"] for r in rows) <= budget


@pytest.mark.parametrize("budgets", ["local", "store"])
def test_a_budget_cleared_and_set_again_counts_what_was_spent_meanwhile(
        tmp_path: Path, start: Callable[..., RunningChatgate], fake: RunningFake, budgets: str) -> None:
    gate = start(limits={"budgets": budgets}, auth={"admin_key": ADMIN_KEY})
    secret = "sk-reset-budget-0013"
    key = key_subject(secret)
    set_limits(store_url(tmp_path), "key", key, budget_picousd=usd("1"), budget_period="month")
    for n in range(2):
        ask(gate.url, secret, n)
    set_limits(store_url(tmp_path), "key", key)  # the budget cleared: spending goes on, untracked
    for n in range(3):
        ask(gate.url, secret, n)
    spent = sum(r["cost_picousd"] for r in records(tmp_path, 5))
    set_limits(store_url(tmp_path), "key", key, budget_picousd=usd("1"), budget_period="month")
    shown = httpx2.get(f"{gate.url}/admin/keys/{key}",
                       headers={"authorization": f"Bearer {ADMIN_KEY}"}).json()["spend"]
    assert shown["spent_usd"] == pytest.approx(spent / 1e12, rel=1e-9)


def test_limits_apply_on_the_anthropic_and_responses_routes_in_their_shapes(
        tmp_path: Path, start: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    import anthropic

    gate = start()
    secret = "sk-every-route-0014"
    set_limits(store_url(tmp_path), "key", key_subject(secret), budget_picousd=usd("0.000001"),
               budget_period="day", rpm=100)
    claude = anthropic.Anthropic(base_url=gate.url + "/anthropic", api_key=secret, max_retries=2, timeout=20)
    with pytest.raises(anthropic.RateLimitError) as refused:
        claude.messages.create(model="claude-sonnet-5-0", max_tokens=64,
                               messages=[{"role": "user", "content": "hi"}])
    assert refused.value.body["type"] == "error"  # type: ignore[index]
    assert refused.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert refused.value.body["error"]["code"] == "insufficient_quota"  # type: ignore[index]
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert refused.value.response.headers["x-ratelimit-limit-requests"] == "100"
    with pytest.raises(openai.RateLimitError) as codex:
        client(gate.url, secret, max_retries=2).responses.create(model="deepseek-flash", input="hi",
                                                                  max_output_tokens=64)
    assert codex.value.code == "insufficient_quota"
    rows = records(tmp_path, 2)  # one record each: neither SDK retried
    assert [(r["route"], r["outcome"], r["rule_code"]) for r in rows] == [
        ("/anthropic/v1/messages", "limited", "budget:key"), ("/responses", "limited", "budget:key")]
    assert chat_requests(fake) == 0 and fake.state.requests == []


def test_a_reservation_is_priced_and_counted_at_the_time_the_usage_record_carries(
        tmp_path: Path, start: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    """The reservation is an upper bound of the record's cost only if both are priced by the same clock
    reading (peak or off-peak), and in the same budget period: the request's start, which the usage record
    carries as its time."""
    gate = start()
    secret = "sk-priced-at-0011"
    set_limits(store_url(tmp_path), "key", key_subject(secret), budget_picousd=usd("1"), budget_period="day")
    quotas = gate.state.quotas
    assert quotas is not None
    admit = quotas.admit
    priced: list[float | None] = []

    async def recording(*args: Any, **kwargs: Any) -> Any:
        priced.append(kwargs.get("started_at"))
        return await admit(*args, **kwargs)

    quotas.admit = recording  # type: ignore[method-assign]
    assert ask(gate.url, secret, 1, max_tokens=32).http_response.status_code == 200
    (record,) = records(tmp_path, 1)
    assert priced == [record["ts"]]
