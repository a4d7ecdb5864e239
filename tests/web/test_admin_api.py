"""The admin API over real HTTP: keys (create, list, get, patch, revoke), team limits (PUT replaces, PATCH
merges), the secret shown once, refusals, 400s with `param`, 404s, and limits that apply to requests at
once."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

from chatgate.gateway.auth import fingerprint
from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.harness import ADMIN_KEY, RunningChatgate, make_settings, run_chatgate
from tests.metering.helpers import chat_body, send_chat, wait_for

LIMITS_CLEARED = {"budget_usd": None, "budget_period": None, "rpm": None, "tpm": None, "max_concurrent": None}


@dataclass
class Gate:
    gate: RunningChatgate
    fake: RunningFake

    @property
    def url(self) -> str:
        return self.gate.url

    def call(self, method: str, path: str, body: Any = None, key: str | None = ADMIN_KEY,
             content: bytes | None = None) -> httpx2.Response:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        if content is None and body is not None:
            return httpx2.request(method, self.url + path, json=body, headers=headers, timeout=10)
        return httpx2.request(method, self.url + path, content=content, headers=headers, timeout=10)

    def create(self, team: str = "search", name: str = "crawler", **limits: Any) -> dict[str, Any]:
        resp = self.call("POST", "/admin/keys", {"team": team, "name": name, **limits})
        assert resp.status_code == 201, resp.text
        body: dict[str, Any] = resp.json()
        return body

    def store(self) -> Any:
        return self.gate.state.store


def start(tmp_path: Path, mode: str) -> Iterator[Gate]:
    with run_fake_deepseek() as fake:
        auth = {"mode": mode, "admin_key": ADMIN_KEY, "key_cache_seconds": 0,
                "admin_failures_per_minute": 1000}  # the tests below send many wrong keys on purpose
        if mode == "managed":
            auth["upstream_api_key"] = "sk-house"
        # Limits cached for long: a change applies at once only because the admin API forgets them.
        settings = make_settings(tmp_path, fake.url, auth=auth, limits={"cache_seconds": 300})
        with run_chatgate(settings) as gate:
            yield Gate(gate, fake)


@pytest.fixture
def managed(tmp_path: Path) -> Iterator[Gate]:
    yield from start(tmp_path, "managed")


@pytest.fixture
def passthrough(tmp_path: Path) -> Iterator[Gate]:
    yield from start(tmp_path, "passthrough")


# --- keys -----------------------------------------------------------------------------------------


def test_a_created_key_shows_its_secret_once_and_works(managed: Gate) -> None:
    resp = managed.call("POST", "/admin/keys", {"team": "search", "name": "crawler"})
    assert resp.status_code == 201 and resp.headers["cache-control"] == "no-store"
    key = resp.json()
    secret = key["secret"]
    assert secret.startswith("cg-") and key["prefix"] == secret[:7] and key["id"].startswith("key_")
    assert (key["object"], key["kind"], key["team"], key["name"]) == ("chatgate.key", "managed", "search",
                                                                      "crawler")
    assert key["revoked"] is False and key["limits"] == LIMITS_CLEARED
    assert key["spend"]["period"] == "month" and key["spend"]["spent_usd"] == 0
    assert send_chat(managed.url, chat_body(1), key=secret).status_code == 200
    digest = hashlib.sha256(secret.encode()).hexdigest()
    listed = managed.call("GET", "/admin/keys").json()
    assert listed["object"] == "list" and [k["id"] for k in listed["data"]] == [key["id"]]
    assert "secret" not in listed["data"][0]
    same = {k: v for k, v in key.items() if k not in ("secret", "spend")}
    assert same == {k: v for k, v in listed["data"][0].items() if k != "spend"}
    for path in ("/admin/keys", f"/admin/keys/{key['id']}", "/admin/teams", "/admin/teams/search",
                 "/admin/usage?by=key"):
        body = managed.call("GET", path)
        assert body.status_code == 200, (path, body.text)
        assert secret not in body.text and digest not in body.text and secret[8:20] not in body.text, path
    patched = managed.call("PATCH", f"/admin/keys/{key['id']}", {"rpm": 100})
    deleted = managed.call("DELETE", f"/admin/keys/{key['id']}")
    for body in (patched, deleted):
        assert secret not in body.text and digest not in body.text


def test_list_get_and_the_key_count_of_teams(managed: Gate) -> None:
    a = managed.create("search", "crawler")
    b = managed.create("search", "indexer", rpm=10)
    c = managed.create("ops", "pager")
    assert [k["id"] for k in managed.call("GET", "/admin/keys").json()["data"]] == [a["id"], b["id"], c["id"]]
    got = managed.call("GET", f"/admin/keys/{b['id']}").json()
    assert got["name"] == "indexer" and got["limits"]["rpm"] == 10 and "secret" not in got
    managed.call("DELETE", f"/admin/keys/{c['id']}")
    teams = managed.call("GET", "/admin/teams").json()["data"]
    assert [(t["team"], t["key_count"]) for t in teams] == [("default", 0), ("ops", 0), ("search", 2)]
    assert all(t["object"] == "chatgate.team" and t["limits"] == LIMITS_CLEARED for t in teams)


def test_patch_changes_only_the_fields_sent_and_null_clears(managed: Gate) -> None:
    key = managed.create(budget_usd="12.50", rpm=60)
    assert key["limits"] == {**LIMITS_CLEARED, "budget_usd": 12.5, "budget_period": "month", "rpm": 60}
    path = f"/admin/keys/{key['id']}"
    assert managed.call("PATCH", path, {"tpm": 5000}).json()["limits"] == {
        "budget_usd": 12.5, "budget_period": "month", "rpm": 60, "tpm": 5000, "max_concurrent": None}
    assert managed.call("PATCH", path, {"rpm": None, "budget_period": "week"}).json()["limits"] == {
        "budget_usd": 12.5, "budget_period": "week", "rpm": None, "tpm": 5000, "max_concurrent": None}
    body = managed.call("PATCH", path, {"budget_usd": None}).json()  # the period goes with the budget
    assert body["limits"] == {**LIMITS_CLEARED, "tpm": 5000}
    assert body["spend"]["remaining_usd"] is None
    assert managed.call("PATCH", path, {}).json()["limits"] == {**LIMITS_CLEARED, "tpm": 5000}
    assert managed.call("PATCH", path, {"tpm": None}).json()["limits"] == LIMITS_CLEARED
    assert managed.store().get_limits("key", key["id"]) is None  # no limit left: the row is gone
    assert managed.call("GET", path).json()["limits"] == LIMITS_CLEARED


def test_budgets_are_exact_decimals(managed: Gate) -> None:
    """JSON numbers are read as decimals, never floats: 19 significant digits arrive whole."""
    key = managed.create()
    path = f"/admin/keys/{key['id']}"
    resp = managed.call("PATCH", path, content=b'{"budget_usd": 1234567.123456789012}')
    assert resp.status_code == 200, resp.text
    assert '"budget_usd":1234567.123456789012,' in resp.text
    assert managed.store().get_limits("key", key["id"]).budget_picousd == 1_234_567_123_456_789_012
    smallest = managed.call("PATCH", path, {"budget_usd": "0.000000000001"})
    assert '"budget_usd":0.000000000001,' in smallest.text
    assert managed.store().get_limits("key", key["id"]).budget_picousd == 1
    assert managed.call("PATCH", path, {"budget_usd": 0.1}).status_code == 200
    assert managed.store().get_limits("key", key["id"]).budget_picousd == 100_000_000_000
    assert managed.call("PATCH", path, {"budget_usd": "9223372.036854775807"}).status_code == 200


def test_a_budget_in_yuan_keeps_its_currency(managed: Gate) -> None:
    """budget_cny (issue 46 §4): kept exactly with its currency; shown under its own name; one currency at a
    time; PATCHing another limit keeps it."""
    key = managed.create()
    path = f"/admin/keys/{key['id']}"
    body = managed.call("PATCH", path, {"budget_cny": "80.5"}).json()
    assert body["limits"] == {"budget_cny": 80.5, "budget_period": "month", "rpm": None, "tpm": None,
                              "max_concurrent": None}
    row = managed.store().get_limits("key", key["id"])
    assert (row.budget_picousd, row.budget_currency) == (80_500_000_000_000, "CNY")
    assert managed.call("PATCH", path, {"rpm": 5}).json()["limits"]["budget_cny"] == 80.5
    both = managed.call("PATCH", path, {"budget_cny": 1, "budget_usd": 1})
    assert both.status_code == 400 and "not both" in both.json()["error"]["message"]
    usd = managed.call("PATCH", path, {"budget_usd": 2}).json()["limits"]
    assert usd["budget_usd"] == 2 and "budget_cny" not in usd
    assert managed.store().get_limits("key", key["id"]).budget_currency == "USD"


def test_delete_revokes_and_a_second_delete_says_already_revoked(managed: Gate) -> None:
    key = managed.create()
    assert send_chat(managed.url, chat_body(1), key=key["secret"]).status_code == 200
    first = managed.call("DELETE", f"/admin/keys/{key['id']}")
    assert first.status_code == 200
    assert first.json()["revoked"] is True and first.json()["already_revoked"] is False
    assert first.json()["revoked_at"] is not None
    assert send_chat(managed.url, chat_body(1), key=key["secret"]).status_code == 401
    second = managed.call("DELETE", f"/admin/keys/{key['id']}")
    assert second.status_code == 200 and second.json()["already_revoked"] is True
    assert second.json()["revoked_at"] == first.json()["revoked_at"]
    listed = managed.call("GET", "/admin/keys").json()["data"]
    assert [(k["id"], k["revoked"]) for k in listed] == [(key["id"], True)]


def test_a_revoked_key_is_refused_at_once_despite_the_key_cache(tmp_path: Path) -> None:
    with run_fake_deepseek() as fake:
        auth = {"mode": "managed", "admin_key": ADMIN_KEY, "key_cache_seconds": 300,
                "upstream_api_key": "sk-house"}
        with run_chatgate(make_settings(tmp_path, fake.url, auth=auth)) as running:
            gate = Gate(running, fake)
            key = gate.create()
            assert send_chat(gate.url, chat_body(1), key=key["secret"]).status_code == 200  # now cached
            assert gate.call("DELETE", f"/admin/keys/{key['id']}").status_code == 200
            assert send_chat(gate.url, chat_body(2), key=key["secret"]).status_code == 401


@pytest.mark.parametrize("key_id", ["key_doesnotexist", "key_", "whatever", "fp-12", "fp-0123456789AB"])
def test_unknown_key_ids_are_404(managed: Gate, key_id: str) -> None:
    for method, body in (("GET", None), ("PATCH", {"rpm": 1}), ("DELETE", None)):
        resp = managed.call(method, f"/admin/keys/{key_id}", body)
        assert resp.status_code == 404, (method, resp.text)
        error = resp.json()["error"]
        assert error["code"] == "key_not_found" and key_id in error["message"]
    assert managed.store().list_limits("key") == []


# --- teams --------------------------------------------------------------------------------------


def test_put_replaces_a_teams_limits_and_patch_changes_the_fields_sent(managed: Gate) -> None:
    managed.create("search", "crawler")
    put = managed.call("PUT", "/admin/teams/search", {"budget_usd": 100, "rpm": 600, "max_concurrent": 8})
    assert put.status_code == 200
    team = put.json()
    assert team["team"] == "search" and team["key_count"] == 1
    assert team["limits"] == {"budget_usd": 100, "budget_period": "month", "rpm": 600, "tpm": None,
                              "max_concurrent": 8}
    assert team["spend"]["remaining_usd"] == 100 and team["spend"]["used_percent"] == 0
    patched = managed.call("PATCH", "/admin/teams/search", {"tpm": 90000, "budget_period": "day"}).json()
    assert patched["limits"] == {"budget_usd": 100, "budget_period": "day", "rpm": 600, "tpm": 90000,
                                 "max_concurrent": 8}
    assert patched["spend"]["period"] == "day"
    assert patched["spend"]["period_end"] - patched["spend"]["period_start"] == 86400
    replaced = managed.call("PUT", "/admin/teams/search", {"rpm": 60}).json()
    assert replaced["limits"] == {**LIMITS_CLEARED, "rpm": 60}  # PUT: what is not sent is cleared
    assert managed.call("GET", "/admin/teams/search").json()["limits"] == replaced["limits"]
    assert managed.call("PUT", "/admin/teams/search", {}).json()["limits"] == LIMITS_CLEARED
    assert managed.store().get_limits("team", "search") is None
    # A team with no key yet can be given limits; it is listed from then on.
    managed.call("PATCH", "/admin/teams/research", {"budget_usd": "250", "budget_period": "total"})
    teams = {t["team"]: t for t in managed.call("GET", "/admin/teams").json()["data"]}
    assert list(teams) == ["default", "research", "search"]
    assert teams["research"]["spend"]["period"] == "total"
    assert (teams["research"]["spend"]["period_start"], teams["research"]["spend"]["period_end"]) == (0, None)


# --- refusals -------------------------------------------------------------------------------------


ROUTES = [("GET", "/admin/keys", None), ("POST", "/admin/keys", {"team": "t", "name": "n"}),
          ("GET", "/admin/keys/{id}", None), ("PATCH", "/admin/keys/{id}", {"rpm": 1}),
          ("DELETE", "/admin/keys/{id}", None), ("GET", "/admin/teams", None),
          ("GET", "/admin/teams/search", None), ("PUT", "/admin/teams/search", {"rpm": 1}),
          ("PATCH", "/admin/teams/search", {"rpm": 1})]


def test_only_the_admin_key_is_accepted(managed: Gate) -> None:
    key = managed.create()
    for method, path, body in ROUTES:
        for wrong in (None, "not-the-admin-key", key["secret"], "sk-a-deepseek-key", ADMIN_KEY + "x"):
            resp = managed.call(method, path.format(id=key["id"]), body, key=wrong)
            assert resp.status_code == 401, (method, path, wrong, resp.text)
            error = resp.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert (error["type"], error["code"]) == ("authentication_error", "invalid_admin_key")
            assert resp.headers["www-authenticate"] == "Bearer"
    # Nothing was changed by the refused calls.
    assert [k["id"] for k in managed.call("GET", "/admin/keys").json()["data"]] == [key["id"]]
    assert managed.store().list_limits("key") == [] and managed.store().list_limits("team") == []
    assert managed.call("GET", f"/admin/keys/{key['id']}").json()["revoked"] is False
    basic = httpx2.get(managed.url + "/admin/keys", headers={"authorization": f"Basic {ADMIN_KEY}"})
    assert basic.status_code == 401


def test_the_admin_api_says_so_when_no_admin_key_is_set(tmp_path: Path) -> None:
    """Closed, and not as a refused key: a 403 naming CHATGATE_ADMIN_KEY (issue 50 item 6)."""
    settings = make_settings(tmp_path, auth={"mode": "managed", "upstream_api_key": "sk-house"})
    with run_chatgate(settings) as gate:
        for headers in ({}, {"authorization": "Bearer"}, {"authorization": "Bearer anything"}):
            resp = httpx2.get(gate.url + "/admin/teams", headers=headers, timeout=10)
            error = resp.json()["error"]
            assert (resp.status_code, error["code"]) == (403, "admin_key_not_configured"), resp.text
            assert "CHATGATE_ADMIN_KEY" in error["message"] and "openssl rand -hex 32" in error["message"]


BAD_BODIES = [
    (b'{"rpm": -1}', "rpm", "invalid_value"),
    (b'{"tpm": 1.5}', "tpm", "invalid_type"),
    (b'{"max_concurrent": "4"}', "max_concurrent", "invalid_type"),
    (b'{"rpm": true}', "rpm", "invalid_type"),
    (b'{"rpm": 9223372036854775808}', "rpm", "invalid_value"),
    (b'{"budget_usd": -5}', "budget_usd", "invalid_value"),
    (b'{"budget_usd": "ten dollars"}', "budget_usd", "invalid_value"),
    (b'{"budget_usd": "1e-13"}', "budget_usd", "invalid_value"),
    (b'{"budget_usd": 0.0000000000001}', "budget_usd", "invalid_value"),
    (b'{"budget_usd": 1e400}', "budget_usd", "invalid_value"),
    (b'{"budget_usd": "9223372.036854775808"}', "budget_usd", "invalid_value"),
    (b'{"budget_usd": "NaN"}', "budget_usd", "invalid_value"),
    (b'{"budget_usd": false}', "budget_usd", "invalid_type"),
    (b'{"budget_period": "year"}', "budget_period", "invalid_value"),
    (b'{"budget_period": "week"}', "budget_period", "invalid_value"),  # a period needs a budget
    (b'{"budget_usd": null, "budget_period": "day"}', "budget_period", "invalid_value"),
    (b'{"budget": 10}', "budget", "unknown_parameter"),
    (b'{"rpm": 1, "secret": "cg-x"}', "secret", "unknown_parameter"),
    (b'{"budget_usd": NaN}', None, "invalid_json"),
    (b'{"rpm": 1', None, "invalid_json"),
    (b"[1, 2]", None, "invalid_json"),
    (b"", None, "invalid_json"),
    (b"\xff\xfe", None, "invalid_json"),
]


@pytest.mark.parametrize(("content", "param", "code"), BAD_BODIES)
def test_bad_limits_are_400_with_the_param(managed: Gate, content: bytes, param: str | None, code: str
                                           ) -> None:
    key = managed.create()
    for method, path in (("PATCH", f"/admin/keys/{key['id']}"), ("PUT", "/admin/teams/search"),
                         ("PATCH", "/admin/teams/search")):
        resp = managed.call(method, path, content=content)
        assert resp.status_code == 400, (method, path, resp.text)
        error = resp.json()["error"]
        assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")
        assert error["message"] and (param is None or f"'{param}'" in error["message"]), error
    assert managed.store().list_limits("key") == [] and managed.store().list_limits("team") == []


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"name": "n"}, "team", "missing_required_parameter"),
    ({"team": "t"}, "name", "missing_required_parameter"),
    ({"team": "", "name": "n"}, "team", "invalid_value"),
    ({"team": " padded", "name": "n"}, "team", "invalid_value"),
    ({"team": "t", "name": "line\nbreak"}, "name", "invalid_value"),
    ({"team": "t", "name": 7}, "name", "invalid_type"),
    ({"team": "t", "name": "n", "rpm": -1}, "rpm", "invalid_value"),
    ({"team": "t", "name": "n", "budget_period": "total"}, "budget_period", "invalid_value"),
    ({"team": "t", "name": "n", "id": "key_mine"}, "id", "unknown_parameter"),
])
def test_a_bad_new_key_is_400_with_the_param_and_creates_nothing(managed: Gate, body: dict[str, Any],
                                                                 param: str, code: str) -> None:
    resp = managed.call("POST", "/admin/keys", body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["param"], error["code"]) == (param, code), error
    assert managed.store().list_keys() == []


def test_a_fingerprint_cannot_be_revoked_and_a_bad_team_name_is_400(managed: Gate) -> None:
    resp = managed.call("DELETE", "/admin/keys/fp-0123456789ab")
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "not_revocable"
    resp = managed.call("PUT", "/admin/teams/%20padded", {"rpm": 1})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "team"
    assert managed.call("POST", "/admin/teams", {}).status_code == 405


def test_the_admin_api_is_503_without_a_store(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, store={"url": "none"}, auth={"admin_key": ADMIN_KEY})
    with run_chatgate(settings) as gate:
        for method, path, body in ROUTES:
            resp = httpx2.request(method, gate.url + path.format(id="key_x"), json=body,
                                  headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)
            assert resp.status_code == 503 and resp.json()["error"]["code"] == "no_store", (method, path)


# --- limits set through the API apply to requests at once ----------------------------------------------


def test_an_rpm_set_on_a_key_applies_at_once(managed: Gate) -> None:
    key = managed.create()
    secret = key["secret"]
    # This request makes chatgate look up (and cache, for limits.cache_seconds = 300 s) the key's limits.
    assert send_chat(managed.url, chat_body(1), key=secret).status_code == 200
    assert managed.call("PATCH", f"/admin/keys/{key['id']}", {"rpm": 1}).status_code == 200
    assert send_chat(managed.url, chat_body(2), key=secret).status_code == 200
    refused = send_chat(managed.url, chat_body(3), key=secret)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.headers["x-ratelimit-limit-requests"] == "1" and int(refused.headers["retry-after"]) >= 1
    other = managed.create(name="other")
    assert send_chat(managed.url, chat_body(4), key=other["secret"]).status_code == 200  # its own key: free
    assert managed.call("PATCH", f"/admin/keys/{key['id']}", {"rpm": None}).status_code == 200
    assert send_chat(managed.url, chat_body(5), key=secret).status_code == 200


def test_max_concurrent_set_on_a_team_applies_to_its_keys_together(managed: Gate) -> None:
    a, b = managed.create("search", "a"), managed.create("search", "b")
    outsider = managed.create("ops", "c")
    assert send_chat(managed.url, chat_body(1), key=a["secret"]).status_code == 200  # limits looked up
    team = managed.call("PUT", "/admin/teams/search", {"max_concurrent": 1})
    assert team.status_code == 200 and team.json()["limits"]["max_concurrent"] == 1
    slow: list[int] = []
    thread = threading.Thread(target=lambda: slow.append(send_chat(
        managed.url, chat_body(2), key=a["secret"], headers={"x-fake-fault": "slow", "x-fake-delay": "1.5"}
    ).status_code))
    thread.start()
    wait_for(lambda: managed.fake.state.active >= 1, 10, "the slow request to reach the fake")
    refused = send_chat(managed.url, chat_body(3), key=b["secret"])
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert send_chat(managed.url, chat_body(4), key=outsider["secret"]).status_code == 200
    thread.join(10)
    assert slow == [200]
    assert send_chat(managed.url, chat_body(5), key=b["secret"]).status_code == 200


def test_a_budget_set_on_a_key_applies_at_once(managed: Gate) -> None:
    key = managed.create()
    assert send_chat(managed.url, chat_body(1), key=key["secret"]).status_code == 200
    managed.call("PATCH", f"/admin/keys/{key['id']}", {"budget_usd": "0.000001"})
    refused = send_chat(managed.url, chat_body(2), key=key["secret"])
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "insufficient_quota"
    assert refused.headers["x-should-retry"] == "false"
    managed.call("PATCH", f"/admin/keys/{key['id']}", {"budget_usd": "5"})
    assert send_chat(managed.url, chat_body(3), key=key["secret"]).status_code == 200
    status = wait_for(lambda: (s := managed.call("GET", f"/admin/keys/{key['id']}").json()["spend"])
                      ["spent_usd"] > 0 and s, 10, "the spend")
    assert status["remaining_usd"] == pytest.approx(5 - status["spent_usd"] - status["held_usd"], abs=1e-12)


def test_limits_of_a_passthrough_fingerprint_and_of_the_default_team(passthrough: Gate) -> None:
    fp = fingerprint("sk-alice")
    assert send_chat(passthrough.url, chat_body(1), key="sk-alice").status_code == 200
    resp = passthrough.call("PATCH", f"/admin/keys/{fp}", {"rpm": 1})
    assert resp.status_code == 200, resp.text
    entry = resp.json()
    assert (entry["id"], entry["kind"], entry["team"]) == (fp, "passthrough", "default")
    assert entry["prefix"] is None and entry["created_at"] is None
    assert send_chat(passthrough.url, chat_body(2), key="sk-alice").status_code == 200
    assert send_chat(passthrough.url, chat_body(3), key="sk-alice").status_code == 429
    assert send_chat(passthrough.url, chat_body(4), key="sk-bob").status_code == 200
    listed = passthrough.call("GET", "/admin/keys").json()["data"]
    assert [(k["id"], k["limits"]["rpm"]) for k in listed] == [(fp, 1)]
    assert passthrough.call("GET", f"/admin/keys/{fp}").json()["limits"]["rpm"] == 1
    # The team `default` holds every passthrough caller.
    assert passthrough.call("PUT", "/admin/teams/default", {"rpm": 2}).status_code == 200
    statuses = [send_chat(passthrough.url, chat_body(i), key=f"sk-carol-{i}").status_code for i in range(3)]
    assert statuses == [200, 200, 429]
    teams = passthrough.call("GET", "/admin/teams").json()["data"]
    assert [(t["team"], t["limits"]["rpm"]) for t in teams] == [("default", 2)]
