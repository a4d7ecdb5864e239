"""The retry engine's pure parts: Retry-After, the back-off, the budget."""

from __future__ import annotations

import email.utils
import time

from app.gateway.retry import RetryPolicy, Tries, backoff, only_keepalives, retry_after


def test_retry_after_in_seconds_or_as_an_http_date() -> None:
    now = 1_800_000_000.0
    assert retry_after("3", now) == 3.0
    assert retry_after(" 0.5 ", now) == 0.5
    assert retry_after(email.utils.formatdate(now + 7, usegmt=True), now) == 7.0
    assert retry_after(email.utils.formatdate(now - 60, usegmt=True), now) == 0.0  # in the past: now
    assert retry_after(None, now) is None
    assert retry_after("soon", now) is None
    assert retry_after("-4", now) == 0.0


def test_full_jitter_doubles_its_ceiling() -> None:
    assert [backoff(n, 0.2, lambda: 1.0) for n in (1, 2, 3)] == [0.2, 0.4, 0.8]
    assert backoff(3, 0.2, lambda: 0.0) == 0.0


def test_no_attempt_starts_past_the_budget_or_the_deadline() -> None:
    tries = Tries(RetryPolicy(2, frozenset({503}), 0.2, 1.0), deadline=time.perf_counter() + 100)
    tries.count = 1
    assert tries.wait(0.5) == 0.5
    assert tries.wait(1.5) is None  # past retry_max_wait_s
    tries.count = 3
    assert tries.wait(0.0) is None  # the retries are spent
    short = Tries(RetryPolicy(2, frozenset({503}), 0.2, 20.0), deadline=time.perf_counter() + 0.3)
    short.count = 1
    assert short.wait(0.5) is None  # past the request's deadline


def test_keepalives_are_comments_and_blank_lines_only() -> None:
    assert only_keepalives(b": keep-alive\n\n: keep-al")
    assert only_keepalives(b"\r\n")
    assert not only_keepalives(b": keep-alive\n\ndata: {")
    assert not only_keepalives(b"event: message_start\n")
