"""Limits across replicas (issue 15): two chatgate replicas sharing PostgreSQL (budgets, reserved atomically
in the store) and Redis (rates and concurrency, counted by Lua scripts), and what happens when Redis goes
away and comes back under fail_open and fail_closed."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx2
import openai
import psycopg
import pytest

from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.harness import ADMIN_KEY, RunningChatgate, make_settings, run_chatgate
from tests.pgutil import fresh_database
from tests.quotas.support import RedisServer, ask, client, key_subject, set_limits, usd

pytestmark = pytest.mark.slow  # replicas on PostgreSQL and a redis-server of its own


@pytest.fixture(scope="module")
def fake() -> Iterator[RunningFake]:
    with run_fake_deepseek() as running:
        yield running


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


@contextmanager
def replicas(tmp_path: Path, fake: RunningFake, store: str, count: int = 2,
             upstream: dict[str, Any] | None = None, **limits: Any) -> Iterator[list[RunningChatgate]]:
    auth = {k: limits.pop(k) for k in ("admin_key", "passthrough_team") if k in limits}
    with ExitStack() as stack:
        out = []
        for n in range(count):
            home = tmp_path / f"replica-{n}"
            home.mkdir(parents=True, exist_ok=True)
            settings = make_settings(home, fake.url, store={"url": store}, auth=auth,
                                     limits={"cache_seconds": 0, **limits}, upstream=upstream or {})
            out.append(stack.enter_context(run_chatgate(settings)))
        yield out


def spent_in(store: str, team: str) -> tuple[int, int, int]:
    """(requests, limited, total cost) of a team's usage records in PostgreSQL."""
    with psycopg.connect(store) as conn:
        row = conn.execute("SELECT count(*), sum(CASE WHEN outcome = 'limited' THEN 1 ELSE 0 END), "
                           "coalesce(sum(cost_picousd), 0) FROM usage WHERE team = %s", (team,)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1] or 0), int(row[2])


def wait_records(store: str, team: str, count: int, timeout: float = 20) -> tuple[int, int, int]:
    deadline = time.monotonic() + timeout
    while True:
        got = spent_in(store, team)
        if got[0] >= count or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


@pytest.mark.postgres
@pytest.mark.parametrize("faults", [False, True], ids=["", "retried-faults"])
def test_two_replicas_200_concurrent_requests_never_overspend_a_team_budget(
        tmp_path: Path, fake: RunningFake, redis_server: RedisServer, faults: bool) -> None:
    """Four keys of one team, 200 requests at once alternating replicas, a team budget worth some 30 to 60 of
    them: the recorded spend stays within it (the stated bound is 0), every request has its record.
    fail_closed: on a loaded host a store call can outlast its deadline, and the default (fail_open) then
    admits the request unchecked, by design; here such a request is refused (503) and the bound must hold.
    With faults, DeepSeek answers 503 to the first attempt of a third of the requests and chatgate retries
    them: a reservation is taken once and held across the attempts, one record per request."""
    fake.state.reset()
    if faults:
        fake.state.configure(fault="http_503", fault_ratio=0.33, fault_attempts=1)
    team = "payments-" + secrets.token_hex(3)
    keys = [f"sk-{team}-{n}" for n in range(4)]
    budget = usd("0.0008")
    upstream = {"retries": 2, "retry_base_ms": 20} if faults else {}
    with fresh_database() as store, replicas(tmp_path, fake, store, upstream=upstream,
                                             redis_url=redis_server.url, passthrough_team=team,
                                             on_backend_error="fail_closed") as gates:
        set_limits(store, "team", team, budget_picousd=budget, budget_period="month")
        statuses: list[int] = []
        lock = threading.Lock()

        def one(n: int) -> None:
            try:
                status = ask(gates[n % 2].url, keys[n % 4], n, max_tokens=32).http_response.status_code
            except openai.RateLimitError as err:
                status = 429
                assert err.code == "insufficient_quota", err.code
            except openai.InternalServerError as err:  # fail_closed: the limits could not be checked
                status = err.status_code
                assert (status, err.code) == (503, "limits_unavailable"), (status, err.code)
            with lock:
                statuses.append(status)

        threads = [threading.Thread(target=one, args=(n,)) for n in range(200)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(statuses) == 200
        served = statuses.count(200)
        assert served >= 20 and statuses.count(429) >= 50, (served, statuses.count(429), statuses.count(503))
        requests, limited, cost = wait_records(store, team, 200)
        assert (requests, limited) == (200, 200 - served)
        assert cost <= budget, f"spent {cost} of a {budget} budget"
        assert fake.state.wait_idle(10)
        chats = [r for r in fake.state.requests if r.path.endswith("/chat/completions")]
        assert sum(1 for r in chats if r.status == 200) == served
        assert not faults or any(r.status == 503 for r in chats)
        # every reservation was settled and the replicas' idle leases went back: nothing is still held
        # (a lease given back stays, holding 0, until it expires), and the ledger has every cost
        deadline = time.monotonic() + 10
        while True:
            with psycopg.connect(store) as conn:
                held = conn.execute("SELECT count(*) FROM budget_holds WHERE amount_picousd > 0").fetchone()
                ledger = conn.execute("SELECT spent_picousd FROM budget_ledger WHERE subject = %s",
                                      (team,)).fetchone()
            if held == (0,) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert held == (0,) and ledger == (cost,), (held, ledger, cost)


@pytest.mark.postgres
def test_rpm_and_concurrency_are_counted_once_across_replicas(
        tmp_path: Path, fake: RunningFake, redis_server: RedisServer) -> None:
    fake.state.reset()
    secret = "sk-shared-rpm-" + secrets.token_hex(4)
    with fresh_database() as store, replicas(tmp_path, fake, store, redis_url=redis_server.url) as gates:
        set_limits(store, "key", key_subject(secret), rpm=5)
        results = []
        for n in range(10):
            try:
                results.append(ask(gates[n % 2].url, secret, n).http_response.status_code)
            except openai.RateLimitError as err:
                results.append(429)
                assert err.response.headers["x-ratelimit-limit-requests"] == "5"
        assert results == [200] * 5 + [429] * 5


def test_redis_down_fail_open_admits_and_fail_closed_refuses_until_it_is_back(
        tmp_path: Path, fake: RunningFake, redis_server: RedisServer) -> None:
    fake.state.reset()
    store = f"sqlite:///{tmp_path}/usage.db"
    open_secret, closed_secret = "sk-open-" + secrets.token_hex(4), "sk-closed-" + secrets.token_hex(4)
    with replicas(tmp_path / "open", fake, store, count=1, redis_url=redis_server.url,
                  on_backend_error="fail_open") as (open_gate,), \
            replicas(tmp_path / "closed", fake, store, count=1, redis_url=redis_server.url,
                     on_backend_error="fail_closed") as (closed_gate,):
        for secret in (open_secret, closed_secret):
            set_limits(store, "key", key_subject(secret), rpm=2)
        for gate, secret in ((open_gate, open_secret), (closed_gate, closed_secret)):
            assert ask(gate.url, secret, 1).http_response.status_code == 200
        redis_server.stop()
        # fail_open: admitted (and counted as a backend error), limits unenforced while Redis is away
        for n in range(3):
            assert ask(open_gate.url, open_secret, n).http_response.status_code == 200
        # fail_closed: a 503 in the OpenAI shape, nothing forwarded
        with pytest.raises(openai.InternalServerError) as caught:
            ask(closed_gate.url, closed_secret, 2)
        err = caught.value
        assert err.status_code == 503 and err.code == "limits_unavailable"
        assert err.response.headers["retry-after"] == "5"
        # a caller without limits never needs Redis: served either way
        assert ask(closed_gate.url, "sk-unlimited-caller", 3).http_response.status_code == 200
        redis_server.start()  # a fresh, empty Redis on the same port
        for gate, secret in ((open_gate, open_secret), (closed_gate, closed_secret)):
            statuses = []
            for n in range(3):
                try:
                    statuses.append(ask(gate.url, secret, n).http_response.status_code)
                except openai.RateLimitError:
                    statuses.append(429)
            assert statuses == [200, 200, 429], "limits are enforced again once Redis is back"
    assert open_gate.state.quotas.backend_errors >= 3 and closed_gate.state.quotas.backend_errors >= 1


def _stream_all(url: str, secret: str, n: int, max_tokens: int) -> int:
    """One slow streamed answer read to its end; its status (429 when refused)."""
    try:
        stream = client(url, secret).chat.completions.create(
            model="deepseek-flash", messages=[{"role": "user", "content": f"Story {n}, please."}],
            max_tokens=max_tokens, stream=True, extra_headers={"x-fake-chunk-delay": "0.15"})
        for _ in stream:
            pass
        return 200
    except openai.RateLimitError:
        return 429
    except openai.InternalServerError as err:  # fail_closed: the limits could not be checked
        assert err.status_code == 503, err
        return 503


@pytest.mark.postgres
@pytest.mark.parametrize(("limit", "value", "allowed"), [("max_concurrent", 3, 3), ("tpm", 2500, 2)])
def test_concurrency_and_tpm_hold_across_replicas_counted_at_the_fake(
        tmp_path: Path, fake: RunningFake, redis_server: RedisServer, limit: str, value: int,
        allowed: int) -> None:
    """12 slow streams at once, alternating replicas: DeepSeek never has more in flight than the limit allows
    (tpm 2,500 against ~1,100 reserved per request: two at a time)."""
    secret = f"sk-shared-{limit}-" + secrets.token_hex(4)
    # Whatever the host's load: a slow Redis connect waits (no 2 s timeout to fail open on) and a failed
    # check refuses (fail_closed, a 503) rather than admitting past the limit.
    with fresh_database() as store, replicas(tmp_path, fake, store, redis_url=redis_server.url,
                                             redis_timeout_s=30, redis_connect_timeout_s=30,
                                             on_backend_error="fail_closed") as gates:
        set_limits(store, "key", key_subject(secret), **{limit: value})
        fake.state.reset()
        results: list[int] = []
        threads = [threading.Thread(target=lambda n=n: results.append(
            _stream_all(gates[n % 2].url, secret, n, max_tokens=1000))) for n in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert fake.state.wait_idle(10)
        assert fake.state.peak_active == allowed, (fake.state.peak_active, results)
        refused = results.count(429) + results.count(503)
        assert refused >= 12 - 3 * allowed and results.count(200) >= 1, results
        forwarded = sum(1 for r in fake.state.requests if r.path.endswith("/chat/completions"))
        assert forwarded == results.count(200)


@pytest.mark.postgres
def test_a_limit_set_through_the_admin_api_applies_on_both_replicas(
        tmp_path: Path, fake: RunningFake, redis_server: RedisServer) -> None:
    fake.state.reset()
    secret = "sk-admin-change-" + secrets.token_hex(4)
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    with fresh_database() as store, replicas(tmp_path, fake, store, redis_url=redis_server.url,
                                             cache_seconds=1.0, admin_key=ADMIN_KEY) as (a, b):
        for n in range(3):
            assert ask(b.url, secret, n).http_response.status_code == 200  # B has looked up: no limits
        changed = time.monotonic()
        resp = httpx2.patch(f"{a.url}/admin/keys/{key_subject(secret)}", json={"rpm": 1}, headers=admin)
        assert resp.status_code == 200 and resp.json()["limits"]["rpm"] == 1, resp.text
        with pytest.raises(openai.RateLimitError):  # A applies it at once: its one request is this one...
            ask(a.url, secret, 4)
            ask(a.url, secret, 5)
        while True:  # ...and B within its cache delay
            try:
                ask(b.url, secret, 6)
            except openai.RateLimitError:
                break
            assert time.monotonic() - changed < 1.0 + 1.5, "B still used the limits it had cached"
            time.sleep(0.05)
