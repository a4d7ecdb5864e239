"""The refusal inspector end to end: a real chatgate in front of the fake DeepSeek, the store it writes to
(SQLite here, PostgreSQL shared by two replicas below), the admin API and `chatgate refusals`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from chatgate.cli import main
from chatgate.refusals.log import Pending, RefusalLog
from chatgate.refusals.record import body_text, redact
from chatgate.refusals.store import RefusalQuery, SQLiteRefusals, open_refusal_store
from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.harness import ADMIN_KEY, RunningChatgate, make_settings, run_chatgate
from tests.pgutil import fresh_database

ADMIN = ADMIN_KEY  # tests/harness.py: a key chatgate accepts at start
CLIENT = {"authorization": "Bearer sk-test-client-0001"}
LONG = "x" * 500


@pytest.fixture(scope="module")
def fake() -> Iterator[RunningFake]:
    with run_fake_deepseek() as running:
        yield running


@pytest.fixture(scope="module")
def gate(fake: RunningFake, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningChatgate]:
    tmp = tmp_path_factory.mktemp("refusals")
    settings = make_settings(tmp, fake.url, auth={"admin_key": ADMIN})
    with run_chatgate(settings) as running:
        yield running


def admin(gate: RunningChatgate, path: str) -> httpx2.Response:
    return httpx2.get(gate.url + path, headers={"authorization": f"Bearer {ADMIN}"}, timeout=10)


def wait_for(fetch: Callable[[], httpx2.Response], ok: Callable[[Any], bool], timeout: float = 10) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        resp = fetch()
        if resp.status_code == 200 and ok(resp.json()):
            return resp.json()
        if time.monotonic() > deadline:
            raise AssertionError(f"not there in time: {resp.status_code} {resp.text[:500]}")
        time.sleep(0.05)


def post(gate: RunningChatgate, body: dict[str, Any], request_id: str, **headers: str) -> httpx2.Response:
    return httpx2.post(gate.url + "/v1/chat/completions", json=body, timeout=10,
                       headers={**CLIENT, "x-request-id": request_id, **headers})


def test_a_request_chatgate_refuses_is_kept_with_its_problems_and_a_redacted_body(gate: RunningChatgate
                                                                                  ) -> None:
    body = {"model": "deepseek-flash", "messages": [{"role": "developer", "content": LONG},
                                                    {"role": "user", "content": "short"}]}
    resp = post(gate, body, "req-refused-1")
    assert resp.status_code == 400
    listed = wait_for(lambda: admin(gate, "/admin/refusals"),
                      lambda d: any(r["request_id"] == "req-refused-1" for r in d["data"]))
    row = next(r for r in listed["data"] if r["request_id"] == "req-refused-1")
    assert row["status"] == 400 and row["source"] == "chatgate" and row["rules"] == ["R5"]
    assert row["route"] == "/v1/chat/completions" and row["team"] == "default"
    assert row["key_id"].startswith("fp-") and "body" not in row
    assert row["problems"][0]["param"] == "messages[0].role"
    shown = admin(gate, "/admin/refusals/req-refused-1").json()
    assert shown["redacted"] is True
    assert LONG not in shown["body"] and f"{LONG[:32]}…[500 chars]" in shown["body"]
    assert '"short"' in shown["body"]
    marked_line = next(line for line in shown["marked"].splitlines() if "<--" in line)
    assert '"role": "developer"' in marked_line and "R5 invalid_role" in marked_line


def test_a_4xx_deepseek_answers_is_kept_as_deepseeks_refusal(gate: RunningChatgate) -> None:
    body = {"model": "deepseek-flash", "messages": [{"role": "user", "content": "hello"}]}
    resp = post(gate, body, "req-deepseek-422", **{"x-fake-fault": "http_422"})
    assert resp.status_code == 422
    shown = wait_for(lambda: admin(gate, "/admin/refusals/req-deepseek-422"), lambda d: True)
    assert shown["source"] == "deepseek" and shown["status"] == 422
    # DeepSeek's 422 is plain text (docs/rules-chat.md): kept as the one problem's message
    assert shown["problems"] == [{"code": "422", "param": None, "message": resp.text, "rule": None}]
    assert shown["rules"] == ["422"]


def test_valid_requests_keep_nothing(gate: RunningChatgate) -> None:
    refusals = gate.state.refusals
    before = refusals.written + len(refusals._pending)
    for i in range(5):
        ok = post(gate, {"model": "deepseek-flash", "messages": [{"role": "user", "content": "hi"}]},
                  f"req-valid-{i}")
        assert ok.status_code == 200
    assert refusals.written + len(refusals._pending) == before
    assert admin(gate, "/admin/refusals/req-valid-0").status_code == 404


def test_filters_and_the_admin_key(gate: RunningChatgate) -> None:
    post(gate, {"model": "deepseek-flash", "messages": []}, "req-empty")
    wait_for(lambda: admin(gate, "/admin/refusals/req-empty"), lambda d: True)
    by_rule = admin(gate, "/admin/refusals?rule=R5").json()["data"]
    assert by_rule and all("R5" in r["rules"] for r in by_rule)
    assert admin(gate, "/admin/refusals?team=nobody").json()["data"] == []
    future = admin(gate, f"/admin/refusals?since={int(time.time()) + 3600}").json()["data"]
    assert future == []
    assert httpx2.get(gate.url + "/admin/refusals", headers=CLIENT).status_code == 401


def test_the_cli_lists_shows_and_says_what_lint_fix_would_repair(gate: RunningChatgate, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    body = {"model": "deepseek-flash", "messages": [{"role": "developer", "content": "be brief"},
                                                    {"role": "user", "content": "hi"}]}
    post(gate, body, "req-cli-1")
    wait_for(lambda: admin(gate, "/admin/refusals/req-cli-1"), lambda d: True)
    store = gate.state.settings.store.url
    config = tmp_path / "fix.toml"
    config.write_text("[repair]\ndeveloper_role = true\n")
    assert main(["refusals", "list", "--store", store, "--rule", "R5"]) == 0
    out = capsys.readouterr().out
    assert "req-cli-1" in out and "R5" in out and out.startswith("time ")
    assert main(["refusals", "list", "--store", store, "--lang", "zh"]) == 0
    chinese = capsys.readouterr().out  # issue 50: the heads in Chinese, the ids and rule codes as they are
    assert chinese.split()[:2] == ["时间", "请求ID"] and "request id" not in chinese and "R5" in chinese
    for name in ("LC_ALL", "LC_MESSAGES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LANG", "zh_CN.UTF-8")
    assert main(["refusals", "list", "--store", store]) == 0
    assert capsys.readouterr().out == chinese
    monkeypatch.delenv("LANG")
    assert main(["refusals", "show", "req-cli-1", "--store", store, "--fix", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "R5 at messages[0].role" in out and "<-- R5 invalid_role" in out
    assert "developer_role at messages[0]" in out and "the body is valid after it." in out
    fixed = admin(gate, "/admin/refusals/req-cli-1?fix=true").json()["fix"]  # the server's repairs: off
    assert fixed["repairs"] == [] and fixed["problems_left"][0]["rule"] == "R5"
    assert main(["refusals", "show", "no-such-request", "--store", store]) == 1


def test_show_fix_names_the_opt_in_repair_and_its_setting(gate: RunningChatgate,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 50 item 8: with the default repairs (developer_role and clamp_max_tokens are off), `--fix`
    says which settings would repair the body, and shows the body they make."""
    body = {"model": "deepseek-flash", "max_tokens": 999_999,
            "messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}]}
    post(gate, body, "req-opt-in")
    wait_for(lambda: admin(gate, "/admin/refusals/req-opt-in"), lambda d: True)
    store = gate.state.settings.store.url
    assert main(["refusals", "show", "req-opt-in", "--store", store, "--fix"]) == 0
    out = capsys.readouterr().out
    assert "chatgate lint --fix repairs nothing here." in out
    assert "opt-in repairs (off in this configuration) would also repair:" in out
    assert "enable: [repair] developer_role = true  (or CHATGATE_REPAIR_DEVELOPER_ROLE=true)" in out
    assert "the body is valid with them." in out or "problems left with them" in out
    repaired = out.split("repaired body with them:\n", 1)[1]
    assert '"role": "system"' in repaired and '"developer"' not in repaired
    fix = admin(gate, "/admin/refusals/req-opt-in?fix=true").json()["fix"]
    assert fix["repairs"] == [] and fix["opt_in"] is not None
    settings = {a["code"]: a["setting"] for a in fix["opt_in"]["repairs"]}
    assert settings["developer_role"] == "repair.developer_role"
    assert fix["opt_in"]["fixed_body"]["messages"][0]["role"] == "system"
    if "clamp_max_tokens" in settings:  # the model's maximum, when the rule found the max_tokens too
        assert fix["opt_in"]["fixed_body"]["max_tokens"] < 999_999


def test_log_content_keeps_the_body_whole(fake: RunningFake, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, fake.url, auth={"admin_key": ADMIN}, server={"log_content": True})
    with run_chatgate(settings) as gate:
        post(gate, {"model": "deepseek-flash", "messages": [{"role": "developer", "content": LONG}]},
             "req-whole")
        shown = wait_for(lambda: admin(gate, "/admin/refusals/req-whole"), lambda d: True)
        assert shown["redacted"] is False and LONG in shown["body"]


def test_capture_refusals_0_turns_the_inspector_off(fake: RunningFake, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, fake.url, auth={"admin_key": ADMIN}, server={"capture_refusals": 0})
    with run_chatgate(settings) as gate:
        assert post(gate, {"model": "deepseek-flash", "messages": []}, "req-off").status_code == 400
        assert gate.state.refusals is None and gate.state.gw.refusals is None
        resp = admin(gate, "/admin/refusals")
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "refusals_off"


def test_redaction_cuts_every_long_string_keys_included() -> None:
    assert redact({"a" * 70: ["b" * 65, "c" * 64, 3, None, {"d": "e" * 100}]}) == {
        f"{'a' * 32}…[70 chars]": [f"{'b' * 32}…[65 chars]", "c" * 64, 3, None,
                                   {"d": f"{'e' * 32}…[100 chars]"}]}


def test_a_body_nested_too_deep_to_redact_is_kept_as_a_note() -> None:
    body = b'{"model":"deepseek-flash","x":' + b"[" * 800 + b"]" * 800 + b"}"
    for keep in (False, True):
        text, _ = body_text(body, keep)
        assert text == f'"[a body nested too deep to keep: {len(body)} bytes]"'


def _pending(request_id: str, ts: float) -> Pending:
    return Pending(request_id, ts, "key_1", "k", "team-a", "/v1/chat/completions", "deepseek-flash", 400,
                   "chatgate",
                   [{"code": "invalid_role", "param": "messages[0].role", "message": "m", "rule": "R5"}],
                   b'{"model":"deepseek-flash"}')


def test_each_process_keeps_its_last_n_and_nothing_past_the_ttl(tmp_path: Path) -> None:
    now = [time.time()]
    store = SQLiteRefusals(str(tmp_path / "r.db"))
    log = RefusalLog(store, keep=3, ttl_hours=72, keep_content=False, clock=lambda: now[0])
    store.migrate()
    old = log._refusal(_pending("old", now[0] - 73 * 3600))
    store.insert([old], "another-replica", 10, 0)  # not purged yet (written by a replica with a longer TTL)
    assert store.list(RefusalQuery(), 0) != []
    assert store.list(RefusalQuery(), log.expired_before()) == []  # past the TTL: never shown
    assert store.lookup("old", log.expired_before()) == []
    for i in range(5):
        log.add(_pending(f"r{i}", now[0] + i))
    log.flush()
    kept = [r.request_id for r in store.list(RefusalQuery(), 0)]
    assert kept == ["r4", "r3", "r2"]  # the last 3, and the expired one deleted
    now[0] += 80 * 3600
    log.flush()  # an idle round purges what expired
    assert store.list(RefusalQuery(), 0) == []
    store.close()


def test_a_store_that_is_down_drops_refusals_and_counts_them(tmp_path: Path) -> None:
    store = SQLiteRefusals(str(tmp_path / "missing" / "r.db"))  # its directory does not exist
    log = RefusalLog(store, keep=10, ttl_hours=72, keep_content=False)
    log.add(_pending("lost", time.time()))
    log.flush()
    assert log.dropped == 1 and log.last_error


@pytest.mark.postgres
def test_two_replicas_on_one_postgresql_see_each_others_refusals(fake: RunningFake, tmp_path: Path) -> None:
    with fresh_database() as url:
        def replica(name: str) -> Any:
            return run_chatgate(make_settings(tmp_path / name, fake.url, auth={"admin_key": ADMIN},
                                              store={"url": url}, server={"capture_refusals": 2}))
        with replica("a") as a, replica("b") as b:
            for i in range(3):
                assert post(a, {"model": "deepseek-flash", "messages": []}, f"pg-a-{i}").status_code == 400
            assert post(b, {"model": "deepseek-flash", "messages": []}, "pg-b-0").status_code == 400
            seen = wait_for(lambda: admin(b, "/admin/refusals"),
                            lambda d: {"pg-a-2", "pg-b-0"} <= {r["request_id"] for r in d["data"]})
            ids = {r["request_id"] for r in seen["data"]}
            assert "pg-a-0" not in ids  # replica a keeps its last 2
            shown = admin(a, "/admin/refusals/pg-b-0").json()
            assert shown["source"] == "chatgate" and shown["problems"]
        rows = open_refusal_store(url).list(RefusalQuery(), 0)
        assert sorted(r.request_id for r in rows) == ["pg-a-1", "pg-a-2", "pg-b-0"]


def test_the_dashboard_has_the_recent_refusals_table(gate: RunningChatgate) -> None:
    page = httpx2.get(gate.url + "/admin/dashboard").text
    script = httpx2.get(gate.url + "/admin/dashboard/dashboard.js").text
    assert 'id="refusals"' in page and "Recent refusals" in page
    assert "/admin/refusals?limit=50" in script and '"#refusal=" + encodeURIComponent(r.refusal_id)' in script
