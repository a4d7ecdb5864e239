"""The pool of DeepSeek accounts (managed mode, `[[upstream.accounts]]`), end to end: chatgate on a loopback
port in front of the fake DeepSeek, whose account keys can be capped at N requests in flight (DeepSeek's 429
concurrency text beyond) or have no balance (402)."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest

from chatgate.gateway.auth import new_key
from chatgate.store.sqlite import SQLiteStore
from tests.fakes.server import RunningFake
from tests.gateway.conftest import usage_rows
from tests.harness import ADMIN_KEY, RunningChatgate, make_settings, run_chatgate
from tests.quotas.support import Webhook, webhook_receiver

KEYS = {"one": "sk-account-one-0001", "two": "sk-account-two-0002"}
ADMIN = ADMIN_KEY  # tests/harness.py: a key chatgate accepts at start
MESSAGES: Any = [{"role": "user", "content": "Summarise the plot of Hamlet"}]


@pytest.fixture
def hook() -> Iterator[Webhook]:
    with webhook_receiver() as receiver:
        yield receiver


@pytest.fixture
def pool(tmp_path: Path, fake: RunningFake, hook: Webhook, monkeypatch: pytest.MonkeyPatch
         ) -> Iterator[tuple[RunningChatgate, str]]:
    """chatgate in managed mode with two accounts (keys in DEEPSEEK_KEY_ONE/TWO) and one client key."""
    monkeypatch.setenv("DEEPSEEK_KEY_ONE", KEYS["one"])
    monkeypatch.setenv("DEEPSEEK_KEY_TWO", KEYS["two"])
    store = SQLiteStore(tmp_path / "usage.db")
    accounts = [{"name": name, "key_env": f"DEEPSEEK_KEY_{name.upper()}"} for name in KEYS]
    settings = make_settings(
        tmp_path, fake.url, auth={"mode": "managed", "admin_key": ADMIN, "key_cache_seconds": 0},
        upstream={"accounts": accounts, "retries": 2, "retry_base_ms": 50, "retry_max_wait_s": 15},
        alerts={"webhook_url": hook.url})
    with run_chatgate(settings, store=store) as gate:
        key_id, secret, digest, prefix = new_key()
        store.create_key(key_id, digest, prefix, "search", "crawler")
        yield gate, secret


def client(gate: RunningChatgate, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gate.url + "/v1", api_key=secret, max_retries=0, timeout=30)


def accounts_state(gate: RunningChatgate) -> dict[str, dict[str, Any]]:
    body = httpx2.get(gate.url + "/readyz").json()
    return {row["name"]: row for row in body["accounts"]}


def test_each_account_gets_its_own_key(pool: tuple[RunningChatgate, str], fake: RunningFake,
                                       tmp_path: Path) -> None:
    gate, secret = pool
    with client(gate, secret) as c:
        for _ in range(4):
            c.chat.completions.create(model="deepseek-flash", messages=MESSAGES)
    keys = Counter(r.auth_key for r in fake.state.requests)
    assert keys == {KEYS["one"]: 2, KEYS["two"]: 2}  # the least in flight, ties in turn
    rows = usage_rows(tmp_path, 4)
    assert Counter(r["account"] for r in rows) == {"one": 2, "two": 2}
    assert all(secret not in str(v) and KEYS["one"] not in str(v) for v in accounts_state(gate).values())


def test_eight_streams_over_two_accounts_capped_at_three_all_complete(
        pool: tuple[RunningChatgate, str], fake: RunningFake, tmp_path: Path) -> None:
    gate, secret = pool
    fake.state.configure(key_concurrency={KEYS["one"]: 3, KEYS["two"]: 3}, chunk_delay=0.03)

    def one_stream(n: int) -> str:
        with client(gate, secret) as c:
            stream = c.chat.completions.create(model="deepseek-flash", stream=True, messages=[
                {"role": "user", "content": f"Question {n}"}], extra_headers={"x-request-id": f"s-{n}"})
            return "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)

    with concurrent.futures.ThreadPoolExecutor(8) as workers:
        texts = list(workers.map(one_stream, range(8)))
    assert all(t.startswith("Answer 1") for t in texts), texts
    statuses = Counter(r.status for r in fake.state.requests)
    assert statuses[200] == 8 and statuses[429] >= 2  # six at a time fit, the others waited for a slot
    # records per account equal what the fake served each account's key
    rows = usage_rows(tmp_path, 8)
    assert all(r["outcome"] == "ok" for r in rows)
    served = fake.state.issued_report()["per_key"]
    by_account = Counter(r["account"] for r in rows)
    assert by_account == {name: served[key]["requests"] for name, key in KEYS.items() if key in served}
    for name, key in KEYS.items():
        for field in ("prompt_tokens", "completion_tokens"):
            assert sum(r[field] for r in rows if r["account"] == name) == served.get(key, {}).get(field, 0)
    assert sum(r["attempts"] for r in rows) == len(fake.state.requests)
    metrics = httpx2.get(gate.url + "/metrics").text
    assert 'chatgate_upstream_attempts_total{account="one",status="200"}' in metrics
    assert 'chatgate_upstream_retries_total{reason="429"}' in metrics


@pytest.mark.parametrize("fault", ["402", "401"])
def test_an_account_without_balance_is_set_aside_and_its_request_goes_to_another(
        pool: tuple[RunningChatgate, str], fake: RunningFake, hook: Webhook, tmp_path: Path, fault: str
) -> None:
    """Issue 48: the request that met the 402 (or 401) was answered so, although another account could serve
    it; nothing was generated, so it goes there."""
    gate, secret = pool
    if fault == "402":
        fake.state.configure(no_balance_keys=[KEYS["two"]])
    else:
        fake.state.configure(valid_keys=[KEYS["one"]])
    statuses = []
    for _ in range(6):
        resp = httpx2.post(gate.url + "/v1/chat/completions", headers={"authorization": f"Bearer {secret}"},
                           json={"model": "deepseek-flash", "messages": MESSAGES}, timeout=30)
        statuses.append(resp.status_code)
    assert statuses == [200] * 6, statuses
    to_two = [r for r in fake.state.requests if r.auth_key == KEYS["two"]]
    assert len(to_two) == 1  # after its first 402, the account is set aside
    assert sorted(r["attempts"] for r in usage_rows(tmp_path, 6)) == [1] * 5 + [2]
    assert accounts_state(gate)["two"]["state"] == "set_aside"
    (event,) = hook.wait(1)
    assert (event["event"], event["account"], event["status"]) == ("account_unavailable", "two", int(fault))
    metrics = httpx2.get(gate.url + "/metrics").text
    assert 'chatgate_upstream_account_available{account="two"} 0.0' in metrics
    assert 'chatgate_upstream_account_available{account="one"} 1.0' in metrics


def test_every_account_set_aside_waits_then_gives_deepseeks_last_error(
        pool: tuple[RunningChatgate, str], fake: RunningFake) -> None:
    gate, secret = pool
    headers = {"authorization": f"Bearer {secret}", "x-fake-fault": "http_429", "x-fake-retry-after": "30"}
    t0 = time.monotonic()
    resp = httpx2.post(gate.url + "/v1/chat/completions", headers=headers,
                       json={"model": "deepseek-flash", "messages": MESSAGES}, timeout=30)
    assert resp.status_code == 429 and time.monotonic() - t0 < 10  # Retry-After 30 > the budget: no wait
    assert resp.headers["x-should-retry"] == "false"
    assert "concurrency" in resp.json()["error"]["message"]
    assert {r.auth_key for r in fake.state.requests} == set(KEYS.values())  # the retry went to the other
    state = accounts_state(gate)
    assert {row["state"] for row in state.values()} == {"set_aside"}
    # while both are set aside, a request gets DeepSeek's last error without reaching it
    before = len(fake.state.requests)
    resp = httpx2.post(gate.url + "/v1/chat/completions", headers={"authorization": f"Bearer {secret}"},
                       json={"model": "deepseek-flash", "messages": MESSAGES}, timeout=30)
    assert resp.status_code == 429, (state, [(r.auth_key, r.status) for r in fake.state.requests])
    assert len(fake.state.requests) == before


def test_admin_accounts_route_shows_names_and_variables_never_keys(pool: tuple[RunningChatgate, str]) -> None:
    gate, _ = pool
    answer = httpx2.get(gate.url + "/admin/accounts", headers={"authorization": f"Bearer {ADMIN}"}).json()
    assert [(r["name"], r["key_env"], r["state"]) for r in answer["data"]] == [
        ("one", "DEEPSEEK_KEY_ONE", "available"), ("two", "DEEPSEEK_KEY_TWO", "available")]
    assert not any(key in str(answer) for key in KEYS.values())


def test_config_check_lists_the_accounts_never_their_keys(tmp_path: Path) -> None:
    from tests.config.test_cli_config import chatgate

    config = tmp_path / "chatgate.toml"
    config.write_text('[auth]\nmode = "managed"\n'
                      '[[upstream.accounts]]\nname = "one"\nkey_env = "DEEPSEEK_KEY_ONE"\n'
                      '[[upstream.accounts]]\nname = "two"\nkey_env = "DEEPSEEK_KEY_TWO"\nweight = 2\n')
    out = chatgate("config", "check", "--config", str(config), env={"DEEPSEEK_KEY_ONE": KEYS["one"]})
    assert out.returncode == 0, out.stderr
    assert "#   one: key in $DEEPSEEK_KEY_ONE (set), weight 1" in out.stdout
    assert "#   two: key in $DEEPSEEK_KEY_TWO (NOT SET), weight 2" in out.stdout
    assert KEYS["one"] not in out.stdout + out.stderr


def test_an_account_without_its_key_variable_makes_the_replica_not_ready(
        tmp_path: Path, fake: RunningFake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSEEK_KEY_ONE", KEYS["one"])
    monkeypatch.delenv("DEEPSEEK_KEY_TWO", raising=False)
    accounts = [{"name": name, "key_env": f"DEEPSEEK_KEY_{name.upper()}"} for name in KEYS]
    settings = make_settings(tmp_path, fake.url, auth={"mode": "managed"}, upstream={"accounts": accounts})
    with run_chatgate(settings) as gate:
        resp = httpx2.get(gate.url + "/readyz")
    assert resp.status_code == 503
    assert "upstream account two: its key variable DEEPSEEK_KEY_TWO is not set" in resp.json()["problems"]
    assert {r["name"]: r["state"] for r in resp.json()["accounts"]} == {"one": "available", "two": "no_key"}


def test_a_passthrough_retry_uses_the_callers_own_key(start_gate: Any, fake: RunningFake) -> None:
    gate = start_gate(upstream={"retries": 2, "retry_base_ms": 10})
    body = {"model": "deepseek-flash", "messages": MESSAGES}
    resp = httpx2.post(gate.url + "/v1/chat/completions", json=body,
                       headers={"authorization": "Bearer sk-callers-own-0042", "x-fake-fault": "http_503",
                                "x-fake-fault-attempts": "1"})
    assert resp.status_code == 200 and resp.headers["x-chatgate-attempts"] == "2"
    assert [r.auth_key for r in fake.state.requests] == ["sk-callers-own-0042"] * 2


def test_every_account_key_refused_is_chatgates_502_never_deepseeks_text(
        pool: tuple[RunningChatgate, str], fake: RunningFake, hook: Webhook) -> None:
    """The key is chatgate's: once every account has answered 401 (the request tried each: nothing was
    generated), the client sees chatgate's 502 upstream_auth_failed, never DeepSeek's text."""
    gate, secret = pool
    fake.state.configure(valid_keys=["sk-no-account-has-this"])
    statuses = []
    for _ in range(3):
        resp = httpx2.post(gate.url + "/v1/chat/completions", headers={"authorization": f"Bearer {secret}"},
                           json={"model": "deepseek-flash", "messages": MESSAGES}, timeout=30)
        statuses.append((resp.status_code, resp.json().get("error", {}).get("code")))
        assert KEYS["one"][-4:] not in resp.text and KEYS["two"][-4:] not in resp.text
    assert statuses == [(502, "upstream_auth_failed")] * 3
    assert Counter(r.auth_key for r in fake.state.requests) == {KEYS["one"]: 1, KEYS["two"]: 1}
    for name in ("one", "two"):
        state = accounts_state(gate)[name]
        assert (state["state"], state["why"]) == ("set_aside", "401") and state["back_in_s"] > 250
    events = hook.wait(2)
    assert sorted((e["event"], e["account"], e["status"]) for e in events) == [
        ("account_unavailable", "one", 401), ("account_unavailable", "two", 401)]
    assert {e["aside_seconds"] for e in events} == {300}


def test_every_account_set_aside_a_request_waits_for_the_first_back(
        pool: tuple[RunningChatgate, str], fake: RunningFake, tmp_path: Path) -> None:
    """Both accounts answer 429 with Retry-After: 1: the third attempt waits for the first one back (within
    the 15 s budget) and is answered."""
    gate, secret = pool
    headers = {"authorization": f"Bearer {secret}", "x-fake-fault": "http_429", "x-fake-fault-attempts": "2",
               "x-fake-retry-after": "1", "x-request-id": "waits-for-an-account"}
    t0 = time.monotonic()
    resp = httpx2.post(gate.url + "/v1/chat/completions", headers=headers,
                       json={"model": "deepseek-flash", "messages": MESSAGES}, timeout=30)
    waited = time.monotonic() - t0
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-chatgate-attempts"] == "3" and 0.9 < waited < 5, waited
    tries = [(r.auth_key, r.status) for r in fake.state.requests]
    assert [s for _, s in tries] == [429, 429, 200] and {k for k, _ in tries[:2]} == set(KEYS.values())
    (row,) = usage_rows(tmp_path, 1)
    assert (row["attempts"], row["account"]) == (3, {v: k for k, v in KEYS.items()}[tries[2][0]])


@pytest.mark.slow  # four streams of 0.3 s chunks: ~5 s of real time
def test_weights_share_requests_in_flight(tmp_path: Path, fake: RunningFake,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Weight 3 against 1: four streams at once go three to one, whichever account the first took."""
    monkeypatch.setenv("DEEPSEEK_KEY_ONE", KEYS["one"])
    monkeypatch.setenv("DEEPSEEK_KEY_TWO", KEYS["two"])
    accounts = [{"name": "one", "key_env": "DEEPSEEK_KEY_ONE", "weight": 3},
                {"name": "two", "key_env": "DEEPSEEK_KEY_TWO"}]
    settings = make_settings(tmp_path, fake.url, auth={"mode": "managed", "admin_key": ADMIN},
                             upstream={"accounts": accounts})
    store = SQLiteStore(tmp_path / "usage.db")
    with run_chatgate(settings, store=store) as gate:
        key_id, secret, digest, prefix = new_key()
        store.create_key(key_id, digest, prefix, "search", "crawler")
        fake.state.configure(chunk_delay=0.3)
        opened = threading.Barrier(5)

        def one_stream(n: int) -> None:
            with client(gate, secret) as c:
                stream = c.chat.completions.create(model="deepseek-flash", stream=True, messages=[
                    {"role": "user", "content": f"Question {n}"}])
                chunks = iter(stream)
                next(chunks)
                opened.wait(10)  # all four in flight at once
                for _ in chunks:
                    pass

        workers = [threading.Thread(target=one_stream, args=(n,)) for n in range(4)]
        for w in workers:
            w.start()
        opened.wait(10)
        in_flight = {r["name"]: r["in_flight"] for r in accounts_state(gate).values()}
        for w in workers:
            w.join(30)
    assert in_flight == {"one": 3, "two": 1}
    assert Counter(r.auth_key for r in fake.state.requests) == {KEYS["one"]: 3, KEYS["two"]: 1}


def test_usage_by_account_reconciles_with_each_accounts_bill(
        pool: tuple[RunningChatgate, str], fake: RunningFake, tmp_path: Path) -> None:
    """`chatgate usage --by account` and GET /admin/usage?by=account against what the fake served each
    account's key, with retries in between (a third of first attempts answered 503)."""
    from tests.metering.helpers import usage_json

    gate, secret = pool
    fake.state.configure(fault="http_503", fault_ratio=0.34, fault_attempts=1)
    with client(gate, secret) as c:
        for n in range(9):
            if n % 2:
                c.chat.completions.create(model="deepseek-flash", messages=MESSAGES, max_tokens=64,
                                          extra_headers={"x-request-id": f"by-account-{n}"})
            else:
                for _ in c.chat.completions.create(model="deepseek-flash", messages=MESSAGES, stream=True,
                                                   extra_headers={"x-request-id": f"by-account-{n}"}):
                    pass
    rows = usage_rows(tmp_path, 9)
    assert sum(r["attempts"] for r in rows) == len(fake.state.requests) > 9  # some were retried
    served = fake.state.issued_report()["per_key"]
    expected = {name: served[key] for name, key in KEYS.items() if key in served}
    http = httpx2.get(gate.url + "/admin/usage?by=account", headers={"authorization": f"Bearer {ADMIN}"})
    cli = usage_json(f"sqlite:///{tmp_path}/usage.db", "account")
    for report in (http.json(), cli):
        got = {r["account"]: r for r in report["rows"]}
        assert set(got) == set(expected), report
        for name, bill in expected.items():
            for field in ("requests", "prompt_tokens", "completion_tokens"):
                assert got[name][field] == bill[field], (name, field, got[name], bill)


@pytest.mark.slow  # headless Chromium
def test_the_dashboard_shows_each_accounts_state(pool: tuple[RunningChatgate, str], fake: RunningFake,
                                                 tmp_path: Path) -> None:
    import re

    from tests.web.test_dashboard import chromium

    gate, secret = pool
    fake.state.configure(no_balance_keys=[KEYS["two"]])
    for _ in range(3):
        httpx2.post(gate.url + "/v1/chat/completions", headers={"authorization": f"Bearer {secret}"},
                    json={"model": "deepseek-flash", "messages": MESSAGES}, timeout=30)
    dom = chromium(tmp_path, "--dump-dom", f"{gate.url}/admin/dashboard#key={ADMIN}").stdout
    assert 'data-state="ready"' in dom, dom[:3000]
    card = re.search(r'<div id="accounts"[^>]*>(.*?)</div>', dom, re.S)
    assert card is not None and 'data-rows="2"' in card.group(0), dom[:3000]
    rows = re.findall(r"<tr>(.*?)</tr>", card.group(1), re.S)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in rows[1:]]
    assert [c[:2] for c in cells] == [["one", "DEEPSEEK_KEY_ONE"], ["two", "DEEPSEEK_KEY_TWO"]], cells
    # requests: all three (the one account two answered 402 went on to account one: issue 48's failover)
    assert cells[0][2] == "available" and cells[0][4] == "3"
    assert re.fullmatch(r"set aside \(402, back in (2\d\d|300) s\)", cells[1][2]), cells
    assert cells[1][4] == "1", cells
    assert not any(key in dom for key in KEYS.values()) and ADMIN not in dom


@pytest.mark.slow  # waits 3.5 s of real time for an attempt that must not come
def test_a_client_hanging_up_while_waiting_for_an_account_gets_no_further_attempt(
        pool: tuple[RunningChatgate, str], fake: RunningFake, tmp_path: Path) -> None:
    """Both accounts answered 429 with Retry-After: 3; the request waits for the first back and its client
    goes away meanwhile: nothing more is sent upstream for it."""
    gate, secret = pool
    headers = {"authorization": f"Bearer {secret}", "x-fake-fault": "http_429", "x-fake-fault-attempts": "2",
               "x-fake-retry-after": "3", "x-request-id": "hangs-up-waiting"}
    with pytest.raises(httpx2.ReadTimeout):
        httpx2.post(gate.url + "/v1/chat/completions", headers=headers,
                    json={"model": "deepseek-flash", "messages": MESSAGES}, timeout=0.8)
    (row,) = usage_rows(tmp_path, 1, timeout=3)
    assert row["outcome"] == "client_disconnected"
    time.sleep(3.5)  # both accounts are back: the request that waited for one sent nothing more
    assert [r.status for r in fake.state.requests] == [429, 429]


def test_a_single_account_answers_the_client_with_deepseeks_402(tmp_path: Path, fake: RunningFake,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Nowhere else to go: DeepSeek's own answer (a top-up takes effect at once)."""
    monkeypatch.setenv("DEEPSEEK_KEY_ONE", KEYS["one"])
    settings = make_settings(tmp_path, fake.url, auth={"mode": "managed", "admin_key": ADMIN},
                             upstream={"accounts": [{"name": "one", "key_env": "DEEPSEEK_KEY_ONE"}],
                                       "retries": 2})
    store = SQLiteStore(tmp_path / "usage.db")
    fake.state.configure(no_balance_keys=[KEYS["one"]])
    with run_chatgate(settings, store=store) as gate:
        key_id, secret, digest, prefix = new_key()
        store.create_key(key_id, digest, prefix, "search", "crawler")
        ask = {"model": "deepseek-flash", "messages": MESSAGES}
        for _ in range(2):
            resp = httpx2.post(gate.url + "/v1/chat/completions", json=ask, timeout=30,
                               headers={"authorization": f"Bearer {secret}"})
            assert resp.status_code == 402 and "Insufficient Balance" in resp.text
    assert len(fake.state.requests) == 2


def test_a_team_pinned_to_its_own_account_only_ever_uses_it(tmp_path: Path, fake: RunningFake,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 48: teams on one account share its context cache, and its cache-hit counts tell one team what
    another sent. Team search has account one to itself; every other team has account two."""
    monkeypatch.setenv("DEEPSEEK_KEY_ONE", KEYS["one"])
    monkeypatch.setenv("DEEPSEEK_KEY_TWO", KEYS["two"])
    accounts = [{"name": "one", "key_env": "DEEPSEEK_KEY_ONE", "teams": ["search"]},
                {"name": "two", "key_env": "DEEPSEEK_KEY_TWO"}]
    settings = make_settings(tmp_path, fake.url, auth={"mode": "managed", "admin_key": ADMIN},
                             upstream={"accounts": accounts, "retries": 2})
    store = SQLiteStore(tmp_path / "usage.db")
    fake.state.configure(prefix_cache=True)
    with run_chatgate(settings, store=store) as gate:
        secrets = {}
        for team in ("search", "ads"):
            key_id, secrets[team], digest, prefix = new_key()
            store.create_key(key_id, digest, prefix, team, f"{team}-key")
        secret_code: Any = [{"role": "system", "content": "The vault code is 4821. " * 40},
                            {"role": "user", "content": "hi"}]
        for team in ("search", "search", "search", "ads", "ads", "ads"):
            with client(gate, secrets[team]) as c:
                c.chat.completions.create(model="deepseek-flash", messages=secret_code)
    rows = usage_rows(tmp_path, 6)
    by_team: dict[str, set[str]] = {}
    for r in rows:
        by_team.setdefault(r["team"], set()).add(r["account"])
    assert by_team == {"search": {"one"}, "ads": {"two"}}, by_team
    assert {r.auth_key for r in fake.state.requests[:3]} == {KEYS["one"]}
    assert {r.auth_key for r in fake.state.requests[3:]} == {KEYS["two"]}
    hits = [(r["team"], r["prompt_cache_hit_tokens"] > 0) for r in rows]
    # search's prompt is in account one's cache; ads' first request, on account two, finds none of it
    assert hits[1:4] == [("search", True), ("search", True), ("ads", False)], hits


def test_a_team_no_account_serves_is_a_clear_503(tmp_path: Path, fake: RunningFake,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSEEK_KEY_ONE", KEYS["one"])
    accounts = [{"name": "one", "key_env": "DEEPSEEK_KEY_ONE", "teams": ["search"]}]
    settings = make_settings(tmp_path, fake.url, auth={"mode": "managed", "admin_key": ADMIN},
                             upstream={"accounts": accounts})
    store = SQLiteStore(tmp_path / "usage.db")
    with run_chatgate(settings, store=store) as gate:
        key_id, secret, digest, prefix = new_key()
        store.create_key(key_id, digest, prefix, "ads", "ads-key")
        resp = httpx2.post(gate.url + "/v1/chat/completions", headers={"authorization": f"Bearer {secret}"},
                           json={"model": "deepseek-flash", "messages": MESSAGES}, timeout=30)
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "no_account_for_team"
    assert fake.state.requests == []
