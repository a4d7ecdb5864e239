"""The retry engine's pure parts: Retry-After, the back-off, the budget."""

from __future__ import annotations

import email.utils
import time

from chatgate.gateway.retry import RetryPolicy, Tries, backoff, only_keepalives, retry_after


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


def test_requests_naming_files_go_to_the_account_that_holds_them() -> None:
    from chatgate.gateway.accounts import Pool
    from chatgate.settings import Settings

    accounts = [{"name": "one", "key_env": "K1"}, {"name": "two", "key_env": "K2"}]
    settings = Settings.model_validate({"auth": {"mode": "managed", "upstream_api_key": "sk-2"},
                                        "upstream": {"accounts": accounts}})
    pool = Pool.from_settings(settings, env={"K1": "sk-1", "K2": "sk-2"})
    assert pool is not None
    held = [pool.acquire(files=True) for _ in range(3)]  # however busy "two" gets
    assert [lease.account.name for lease in held if lease is not None] == ["two"] * 3
    assert pool.acquire().account.name == "one"  # type: ignore[union-attr]
    # DEEPSEEK_API_KEY outside the pool: an account of its own, for files only, shown with the others
    apart = Pool.from_settings(settings, env={"K1": "sk-1", "K2": "sk-3"})
    assert apart is not None
    assert apart.acquire(files=True).account.name == "files"  # type: ignore[union-attr]
    assert [row["name"] for row in apart.states()] == ["one", "two", "files"]
    assert {apart.acquire().account.name for _ in range(4)} == {"one", "two"}  # type: ignore[union-attr]


def test_a_429s_retry_after_sets_an_account_aside_for_at_most_the_cooldown() -> None:
    from chatgate.gateway.accounts import RATE_LIMIT_ASIDE_MAX_S, Account, Pool
    from chatgate.gateway.upstream import ReadAnswer

    now = [1000.0]
    pool = Pool([Account("one", "K1", b"Bearer sk-1"), Account("two", "K2", b"Bearer sk-2")], cooldown_s=300,
                clock=lambda: now[0])
    one, two = pool.accounts
    pool.rate_limited(one, 86_400.0, 0.2, ReadAnswer(429, [], b""))  # an HTTP date a day away
    assert one.aside_until == 1300.0
    pool.rate_limited(two, 2.0, 0.2, ReadAnswer(429, [], b""))
    assert two.aside_until == 1002.0
    brief = Pool([Account("one", "K1", b"Bearer sk-1")], cooldown_s=0, clock=lambda: now[0])
    brief.rate_limited(brief.accounts[0], 60.0, 0.2, ReadAnswer(429, [], b""))
    assert brief.accounts[0].aside_until == 1000.0 + RATE_LIMIT_ASIDE_MAX_S
