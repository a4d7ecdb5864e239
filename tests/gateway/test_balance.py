"""`GET /user/balance` through a real chatgate in front of the fake DeepSeek: passthrough asks with the
caller's own key and relays DeepSeek's answer as it came; managed mode answers the admin key only (asked
with the upstream key: it is the whole account's balance), 403 for client keys, 401 for missing or unknown
ones. Every request is access-logged and counted in /metrics, none gets a usage record."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest

from chatgate.demo.fim import BALANCE
from chatgate.gateway.auth import fingerprint, new_key
from chatgate.store.sqlite import SQLiteStore
from tests.fakes.server import RunningFake
from tests.gateway.conftest import _read_usage
from tests.harness import ADMIN_KEY, RunningChatgate, make_settings, run_chatgate, unreachable_url
from tests.metering.helpers import wait_for

KEY = "sk-balance-client-0001"
ADMIN = ADMIN_KEY  # tests/harness.py: a key chatgate accepts at start
UPSTREAM = "sk-upstream-account-key"


def get(gate: RunningChatgate, key: str | None, path: str = "/user/balance", **headers: str
        ) -> httpx2.Response:
    sent = dict(headers)
    if key is not None:
        sent["authorization"] = f"Bearer {key}"
    return httpx2.get(gate.url + path, headers=sent, timeout=10)


def metric(gate: RunningChatgate, status: int) -> float:
    """chatgate_requests_total for the balance route and this status (0 when never counted)."""
    prefix = f'chatgate_requests_total{{model="",route="/user/balance",status="{status}"}} '
    for line in httpx2.get(gate.url + "/metrics").text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix):])
    return 0.0


def access_lines(gate: RunningChatgate, capfd: pytest.CaptureFixture[str]) -> dict[str, dict[str, Any]]:
    """The balance route's access-log lines, by request id."""
    gate.state.gw.ledger.access_log.flush()
    lines = [json.loads(line) for line in capfd.readouterr().out.splitlines()
             if line.startswith('{"event":"request"')]
    return {line["request_id"]: line for line in lines if line["route"] == "/user/balance"}


def assert_no_usage_record(gate: RunningChatgate, tmp_path: Path) -> None:
    wait_for(lambda: gate.state.recorder.pending == 0, 10, "the recorder to be idle")
    assert _read_usage(tmp_path / "usage.db") == []


# ------------------------------------------------------------------------------------------- passthrough


@pytest.mark.parametrize("path", ["/user/balance", "/v1/user/balance"])
def test_passthrough_forwards_the_callers_key_and_relays_the_answer(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Path,
        capfd: pytest.CaptureFixture[str], path: str) -> None:
    gate = start_gate(server={"access_log": True})
    response = get(gate, KEY, path, **{"x-request-id": "balance-1"})
    assert response.status_code == 200
    assert response.json() == BALANCE
    (rec,) = fake.state.requests
    assert (rec.method, rec.path, rec.auth_key, rec.request_id) == ("GET", "/user/balance", KEY, "balance-1")
    assert response.content == bytes(rec.sent), "relayed as DeepSeek sent it"
    assert response.headers["x-request-id"] == "balance-1" and "x-ds-trace-id" in response.headers
    line = access_lines(gate, capfd)["balance-1"]
    assert (line["status"], line["outcome"], line["key_id"]) == (200, "ok", fingerprint(KEY))
    assert KEY not in json.dumps(line)
    assert metric(gate, 200) == 1
    assert_no_usage_record(gate, tmp_path)


def test_passthrough_relays_deepseeks_401(gate: RunningChatgate, fake: RunningFake, tmp_path: Path) -> None:
    bad = get(gate, "sk-bad-key-0042")
    assert bad.status_code == 401
    assert bad.json()["error"] == {"message": "Authentication Fails, Your api key: ****0042 is invalid",
                                   "type": "authentication_error", "param": None,
                                   "code": "invalid_request_error"}
    missing = get(gate, None)
    assert missing.status_code == 401 and "auth header format" in missing.json()["error"]["message"]
    assert [r.auth_key for r in fake.state.requests] == ["sk-bad-key-0042", None]
    assert metric(gate, 401) == 2
    assert_no_usage_record(gate, tmp_path)


def test_unreachable_upstream_is_502(start_gate: Callable[..., RunningChatgate], tmp_path: Path,
                                     capfd: pytest.CaptureFixture[str]) -> None:
    gate = start_gate(upstream_url=unreachable_url(), server={"access_log": True})
    response = get(gate, KEY, **{"x-request-id": "balance-down"})
    assert response.status_code == 502
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("upstream_error", "upstream_unreachable")
    assert KEY not in response.text
    line = access_lines(gate, capfd)["balance-down"]
    assert (line["status"], line["outcome"], line["code"]) == (502, "upstream_failed", "upstream_unreachable")
    assert metric(gate, 502) == 1
    assert_no_usage_record(gate, tmp_path)


def test_only_get_is_served(gate: RunningChatgate, fake: RunningFake) -> None:
    response = httpx2.post(gate.url + "/user/balance", content=b"{}", timeout=10,
                           headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert response.status_code == 405 and response.json()["error"]["code"] == "method_not_allowed"
    assert fake.state.requests == []


# ------------------------------------------------------------------------------------------- managed


@pytest.fixture
def managed(tmp_path: Path, fake: RunningFake, capfd: pytest.CaptureFixture[str]
            ) -> Iterator[tuple[RunningChatgate, str]]:
    """chatgate in managed mode with an admin key, the upstream key, and one client key (returned). It
    starts once capfd captures (the access log writes to the stdout it finds at start)."""
    store = SQLiteStore(tmp_path / "usage.db")
    settings = make_settings(tmp_path, fake.url, server={"access_log": True}, auth={
        "mode": "managed", "upstream_api_key": UPSTREAM, "admin_key": ADMIN, "key_cache_seconds": 0})
    with run_chatgate(settings, store=store) as gate:
        key_id, secret, digest, prefix = new_key()
        store.create_key(key_id, digest, prefix, "search", "crawler")
        yield gate, secret


def test_managed_admin_gets_the_accounts_balance_with_the_upstream_key(
        managed: tuple[RunningChatgate, str], fake: RunningFake, tmp_path: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    gate, _ = managed
    response = get(gate, ADMIN, "/v1/user/balance", **{"x-request-id": "admin-balance"})
    assert response.status_code == 200 and response.json() == BALANCE
    (rec,) = fake.state.requests
    assert rec.auth_key == UPSTREAM, "the account's balance is asked with the upstream key"
    assert ADMIN not in orjson.dumps(rec.headers).decode()
    line = access_lines(gate, capfd)["admin-balance"]
    assert (line["status"], line["outcome"], line["key_id"]) == (200, "ok", "admin")
    assert metric(gate, 200) == 1
    assert_no_usage_record(gate, tmp_path)


def test_managed_refuses_client_keys_with_403_and_strangers_with_401(
        managed: tuple[RunningChatgate, str], fake: RunningFake, tmp_path: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    gate, client_key = managed
    refused = get(gate, client_key, **{"x-request-id": "client-balance"})
    assert refused.status_code == 403
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("permission_error", "admin_key_required")
    assert "admin key" in error["message"]
    unknown = get(gate, "cg-not-a-key", **{"x-request-id": "unknown-balance"})
    missing = get(gate, None, **{"x-request-id": "anonymous-balance"})
    assert (unknown.status_code, missing.status_code) == (401, 401)
    assert unknown.json()["error"]["type"] == "authentication_error"
    assert fake.state.requests == [], "nothing reaches DeepSeek"
    lines = access_lines(gate, capfd)
    assert {rid: (line["status"], line["outcome"]) for rid, line in lines.items()} == {
        "client-balance": (403, "refused"), "unknown-balance": (401, "refused"),
        "anonymous-balance": (401, "refused")}
    assert (metric(gate, 403), metric(gate, 401)) == (1, 2)
    assert_no_usage_record(gate, tmp_path)
