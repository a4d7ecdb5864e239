"""Refusals confirmed with DeepSeek (issue 47, docs/confirmation.md), on a real server in front of the fake
DeepSeek, which changes its mind on request (`accept_refusals`, `refuse_bodies`)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest

from chatgate.metering import text
from tests.fakes.server import RunningFake, run_fake_deepseek
from tests.gateway.conftest import usage_rows
from tests.harness import ADMIN_KEY, RunningChatgate, make_settings, run_chatgate
from tests.pgutil import fresh_database

HEADERS = {"content-type": "application/json", "authorization": "Bearer sk-test-client-0001",
           "x-api-key": "sk-test-client-0001"}
CONFIRM = {"confirm_every_s": 3600}
CHAT = "/v1/chat/completions"
# R29: stream_options without stream; DeepSeek says "stream_options should be set along with stream = true"
R29 = {"model": "deepseek-flash", "messages": [{"role": "user", "content": "hi"}],
       "stream_options": {"include_usage": True}}


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def fake_server() -> Iterator[RunningFake]:
    with run_fake_deepseek() as running:
        yield running


@pytest.fixture
def fake(fake_server: RunningFake) -> Iterator[RunningFake]:
    fake_server.state.reset()
    yield fake_server
    assert fake_server.state.wait_idle(5.0)
    fake_server.state.reset()


@pytest.fixture
def start(tmp_path: Path, fake: RunningFake) -> Iterator[Callable[..., RunningChatgate]]:
    stack: list[Any] = []

    def run(clock: Clock | None = None, **sections: dict[str, Any]) -> RunningChatgate:
        sections.setdefault("validation", CONFIRM)
        sections.setdefault("auth", {"admin_key": ADMIN_KEY})
        cm = run_chatgate(make_settings(tmp_path, fake.url, **sections), clock=clock)
        stack.append(cm)
        return cm.__enter__()

    yield run
    for cm in reversed(stack):
        cm.__exit__(None, None, None)


def post(gate: RunningChatgate, body: dict[str, Any], path: str = CHAT) -> httpx2.Response:
    return httpx2.post(gate.url + path, headers=HEADERS, content=orjson.dumps(body), timeout=20)


def rules(gate: RunningChatgate) -> dict[str, Any]:
    resp = httpx2.get(gate.url + "/admin/rules", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert resp.status_code == 200, resp.text
    found: dict[str, Any] = resp.json()
    return found


def rule_row(gate: RunningChatgate, rule: str) -> dict[str, Any]:
    [row] = [r for r in rules(gate)["rules"] if r["rule"] == rule]
    return row


def test_with_0_nothing_refused_is_ever_forwarded(start: Callable[..., RunningChatgate], fake: RunningFake
                                                  ) -> None:
    gate = start(validation={"confirm_every_s": 0})
    fake.state.configure(accept_refusals=["stream_options"])
    for _ in range(3):
        assert post(gate, R29).status_code == 400
    assert fake.state.requests == []
    assert rules(gate) == {"rules": [], "unpredicted": []}


def test_a_confirmed_refusal_refuses_at_once_until_the_period_is_over(
        start: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Path) -> None:
    clock = Clock()
    gate = start(clock)
    first = post(gate, R29)
    assert first.status_code == 400
    assert first.json()["error"]["code"] == "stream_options_without_stream"  # chatgate's own error
    assert [p["rule"] for p in first.json()["error"]["problems"]] == ["R29"]
    assert len(fake.state.requests) == 1  # forwarded once to confirm it
    row = rule_row(gate, "R29")
    assert (row["status"], row["confirmed"], row["family"], row["model"]) == \
        ("enforced", 1, "chat", "deepseek-flash")
    clock.now += 3599
    assert post(gate, R29).status_code == 400
    assert len(fake.state.requests) == 1  # confirmed within the period: refused at once
    clock.now += 2
    assert post(gate, R29).status_code == 400
    assert len(fake.state.requests) == 2  # older than the period: confirmed again
    assert rule_row(gate, "R29")["confirmed"] == 2
    records = usage_rows(tmp_path, 3)
    assert [(r["outcome"], r["upstream_status"]) for r in records] == \
        [("rejected", 400), ("rejected", None), ("rejected", 400)]


def test_a_rule_deepseek_stops_enforcing_is_disputed_and_enforced_again_in_its_words(
        start: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Path) -> None:
    gate = start()
    fake.state.configure(accept_refusals=["stream_options"])
    first = post(gate, R29)
    assert first.status_code == 200, first.text
    assert first.content == bytes(fake.state.requests[-1].sent)  # DeepSeek's answer, byte for byte
    assert "R29" in first.headers["x-chatgate-warning"]
    assert rule_row(gate, "R29")["status"] == "disputed"
    for _ in range(2):  # the next identical requests are forwarded, with the rule's warning
        again = post(gate, R29)
        assert again.status_code == 200 and "R29" in again.headers["x-chatgate-warning"]
    assert len(fake.state.requests) == 3
    row = rule_row(gate, "R29")
    assert (row["disputed"], row["warned"], row["accepted"]) == (1, 2, 2)
    records = usage_rows(tmp_path, 3)
    assert records[0]["rule_code"] == "disputed:R29" and records[0]["outcome"] == "ok"
    metrics = httpx2.get(gate.url + "/metrics").text
    assert 'chatgate_rule_evidence_total{event="disputed",family="chat",rule="R29"} 1.0' in metrics
    fake.state.configure(accept_refusals=[])  # DeepSeek enforces it again
    refused = post(gate, R29)
    assert refused.status_code == 400 and b"stream_options should be set" in refused.content  # DeepSeek's
    assert rule_row(gate, "R29")["status"] == "enforced"
    assert post(gate, R29).status_code == 400
    assert len(fake.state.requests) == 4  # enforced, confirmed just now: refused at once


def test_the_dry_run_tells_a_disputed_rule_as_a_warning_as_the_gateway_does(
        start: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    gate = start()
    dry = CHAT + "/validate"
    before = post(gate, R29, dry)
    assert before.status_code == 400 and "R29" in before.text  # not confirmed yet: the rule stands
    fake.state.configure(accept_refusals=["stream_options"])
    assert post(gate, R29).status_code == 200  # DeepSeek accepted it: disputed
    answer = post(gate, R29, dry)
    assert answer.status_code == 200, answer.text
    told = answer.json()
    assert told["valid"] is True and [w["rule"] for w in told["warnings"]] == ["R29"]
    assert "disputed" in told["warnings"][0]["message"]
    assert len(fake.state.requests) == 1  # the dry run forwards nothing
    other = post(gate, {**R29, "n": 2}, dry)  # R38 is not disputed: still refused, with R29
    assert other.status_code == 400 and "R38" in other.text


def test_a_new_deepseek_refusal_is_an_unpredicted_group(start: Callable[..., RunningChatgate],
                                                         fake: RunningFake) -> None:
    gate = start()
    fake.state.configure(refuse_bodies={"tell me": "Invalid 'user': 42 is not allowed for req-1234abcd"})
    ids = []
    for i in range(3):
        body = {"model": "deepseek-flash", "messages": [{"role": "user", "content": f"tell me {i}"}]}
        resp = post(gate, body)
        assert resp.status_code == 400  # DeepSeek's answer, relayed
        ids.append(resp.headers["x-request-id"])
    [group] = rules(gate)["unpredicted"]
    assert (group["family"], group["model"], group["count"]) == ("chat", "deepseek-flash", 3)
    assert group["message"] == "Invalid 'user': N is not allowed for X"
    assert group["example_request_ids"] == ids
    assert post(gate, {"model": "deepseek-flash", "messages": [{"role": "user", "content": "hi"}]}
                ).status_code == 200


def test_a_stream_forwarded_to_confirm_is_relayed_when_deepseek_accepts_it(
        start: Callable[..., RunningChatgate], fake: RunningFake) -> None:
    gate = start()
    fake.state.configure(accept_refusals=["max_tokens"])
    body = {"model": "deepseek-flash", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0,
            "stream": True}
    resp = post(gate, body)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    assert resp.content == bytes(fake.state.requests[-1].sent)
    assert "R27" in resp.headers["x-chatgate-warning"]
    assert rule_row(gate, "R27")["status"] == "disputed"


@pytest.mark.parametrize(("path", "body", "rule", "words"), [
    ("/anthropic/v1/messages",
     {"model": "deepseek-flash", "max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}, "A2",
     "max_tokens"),
    ("/v1/responses", {"model": "deepseek-flash", "input": "hi", "max_output_tokens": 0}, "P17",
     "max_output_tokens"),
    ("/beta/completions", {"model": "deepseek-flash", "prompt": "def f(", "max_tokens": 0}, "F6",
     "max_tokens"),
])
def test_every_model_family_confirms_with_its_own_error(
        start: Callable[..., RunningChatgate], fake: RunningFake, path: str, body: dict[str, Any], rule: str,
        words: str) -> None:
    gate = start()
    refused = post(gate, body, path)
    assert refused.status_code == 400 and len(fake.state.requests) == 1
    assert rule in {p["rule"] for p in refused.json()["error"]["problems"]}  # chatgate's own, its shape
    assert rule_row(gate, rule)["status"] == "enforced"
    fake.state.configure(accept_refusals=[words])
    assert post(gate, body, path).status_code == 400  # confirmed within the period: at once
    assert len(fake.state.requests) == 1


def test_a_false_alarm_of_another_family_is_relayed(start: Callable[..., RunningChatgate], fake: RunningFake
                                                    ) -> None:
    gate = start()
    fake.state.configure(accept_refusals=["max_tokens"])
    body = {"model": "deepseek-flash", "max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}
    resp = post(gate, body, "/anthropic/v1/messages")
    assert resp.status_code == 200 and resp.json()["type"] == "message"
    assert "A2" in resp.headers["x-chatgate-warning"]
    assert rule_row(gate, "A2")["status"] == "disputed"


def test_chatgates_own_protections_are_never_forwarded(start: Callable[..., RunningChatgate],
                                                       fake: RunningFake) -> None:
    gate = start()
    bad = httpx2.post(gate.url + CHAT, headers=HEADERS, content=b'{"model": "deepseek-flash", "messages": [')
    assert bad.status_code == 400
    deep = httpx2.post(gate.url + CHAT, headers=HEADERS, content=b"[" * 300 + b"]" * 300)
    assert deep.status_code == 400
    assert fake.state.requests == []


@pytest.mark.postgres
def test_two_replicas_on_one_postgres_send_at_most_one_confirmation(tmp_path: Path, fake: RunningFake
                                                                    ) -> None:
    fake.state.configure(slow_delay=0.3, fault="slow")  # the confirmation takes a while: the others race it
    with fresh_database() as url:
        gates = []
        stack = []
        for i in range(2):
            settings = make_settings(tmp_path / f"r{i}", fake.url, validation=CONFIRM,
                                     auth={"admin_key": ADMIN_KEY},
                                     store={"url": url, "spool_dir": str(tmp_path / f"spool{i}")})
            cm = run_chatgate(settings)
            stack.append(cm)
            gates.append(cm.__enter__())
        try:
            statuses: list[int] = []
            start = threading.Barrier(8)

            def send(gate: RunningChatgate) -> None:
                start.wait()
                statuses.append(post(gate, R29).status_code)

            threads = [threading.Thread(target=send, args=(gates[i % 2],)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert statuses == [400] * 8
            assert len(fake.state.requests) == 1
            assert rule_row(gates[1], "R29")["confirmed"] == 1  # the other replica sees it
        finally:
            for cm in reversed(stack):
                cm.__exit__(None, None, None)


def chatgate_cli(tmp_path: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATGATE_")}
    done = subprocess.run([sys.executable, "-m", "chatgate", *args, "--store",
                           f"sqlite:///{tmp_path}/usage.db"],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_chatgate_rules_reports_and_resets(start: Callable[..., RunningChatgate], fake: RunningFake,
                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = start()
    post(gate, R29)  # confirmed
    fake.state.configure(accept_refusals=["max_tokens"], refuse_bodies={"tell me": "Unknown thing 77"})
    post(gate, {"model": "deepseek-flash", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0})
    post(gate, {"model": "deepseek-flash", "messages": [{"role": "user", "content": "tell me"}]})
    report = orjson.loads(chatgate_cli(tmp_path, "rules", "--format", "json"))
    assert report == rules(gate)
    assert {(r["rule"], r["status"]) for r in report["rules"]} == {("R29", "enforced"), ("R27", "disputed")}
    assert set(report["rules"][0]) >= {"rule", "family", "model", "certainty", "status", "confirmed",
                                       "disputed", "last_confirmed", "last_disputed", "example_request_id"}
    assert report["unpredicted"][0]["message"] == "Unknown thing N"
    table = chatgate_cli(tmp_path, "rules")
    assert "R27" in table and "disputed" in table and "Unknown thing N" in table
    assert max(len(line) for line in table.splitlines()) <= 120
    assert table.split()[:2] == ["rule", "family"]
    chinese = chatgate_cli(tmp_path, "rules", "--lang", "zh")  # issue 50: the heads in Chinese
    assert chinese.split()[:3] == ["规则", "接口", "模型"] and "last confirmed" not in chinese
    assert "R27" in chinese and "Unknown thing N" in chinese and "次数" in chinese
    assert "无规则预见" in chinese and "no rule predicted" not in chinese and "no rule predicted" in table
    assert max(text.width(line) for line in chinese.splitlines()) <= 120
    for name in ("LC_ALL", "LC_MESSAGES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LANG", "zh_CN.UTF-8")
    assert chatgate_cli(tmp_path, "rules") == chinese
    monkeypatch.delenv("LANG")
    assert orjson.loads(chatgate_cli(tmp_path, "rules", "--family", "anthropic", "--format", "json")) == \
        {"rules": [], "unpredicted": []}
    assert orjson.loads(chatgate_cli(tmp_path, "rules", "--since", "2099-01-01", "--format", "json")) == \
        {"rules": [], "unpredicted": []}
    assert "R27: 1 row(s)" in chatgate_cli(tmp_path, "rules", "reset", "R27", "--family", "chat")
    assert [r["rule"] for r in orjson.loads(chatgate_cli(tmp_path, "rules", "--format", "json"))["rules"]] \
        == ["R29"]


@pytest.mark.slow  # headless Chromium
def test_the_dashboards_rules_card_shows_disputed_rules_and_unpredicted_refusals(
        start: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Path) -> None:
    from tests.web.test_dashboard import chromium

    gate = start()
    fake.state.configure(accept_refusals=["stream_options"], refuse_bodies={"tell me": "Unknown thing 77"})
    assert post(gate, R29).status_code == 200
    assert post(gate, {"model": "deepseek-flash", "messages": [{"role": "user", "content": "tell me"}]}
                ).status_code == 400
    dom = chromium(tmp_path, "--dump-dom", f"{gate.url}/admin/dashboard#key={ADMIN_KEY}").stdout
    assert 'data-state="ready"' in dom, dom[:3000]
    card = dom[dom.index("id=\"rules-card\""):]
    assert '<td class="">R29</td><td class="">chat</td><td class="">deepseek-flash</td>' in card
    assert '<td class="num">1</td><td class="">chat</td>' in card and "Unknown thing N" in card


def test_a_warned_rule_deepseek_refuses_in_its_words_is_promoted(start: Callable[..., RunningChatgate],
                                                                 fake: RunningFake) -> None:
    gate = start(validation={"confirm_every_s": 3600, "promote_after": 2},
                 repair={"thinking_conflict": False})
    # R41 only warns; the fake refuses it in R41's words ("thinking options type cannot be disabled …")
    body = {"model": "deepseek-flash", "messages": [{"role": "user", "content": "hi"}],
            "thinking": {"type": "disabled"}, "reasoning_effort": "high"}
    for _ in range(2):
        relayed = post(gate, body)
        assert relayed.status_code == 400 and b"cannot be disabled" in relayed.content  # DeepSeek's words
    row = rule_row(gate, "R41")
    assert (row["status"], row["warned"], row["refused"], row["accepted"]) == ("enforced", 2, 2, 0)
    refused = post(gate, body)
    assert refused.status_code == 400 and refused.json()["error"]["problems"][0]["rule"] == "R41"
    assert len(fake.state.requests) == 2  # enforced: refused by chatgate at once


def test_a_disputed_rule_sends_the_rule_disputed_alert(start: Callable[..., RunningChatgate],
                                                       fake: RunningFake) -> None:
    from tests.quotas.support import webhook_receiver

    with webhook_receiver() as hook:
        gate = start(alerts={"webhook_url": hook.url})
        fake.state.configure(accept_refusals=["stream_options"])
        resp = post(gate, R29)
        assert resp.status_code == 200
        [alert] = hook.wait(1)
        assert {k: alert[k] for k in ("event", "rule", "family", "model", "request_id")} == {
            "event": "rule_disputed", "rule": "R29", "family": "chat", "model": "deepseek-flash",
            "request_id": resp.headers["x-request-id"]}


@pytest.mark.parametrize(("path", "body", "rule", "words"), [
    ("/v1/responses", {"model": "deepseek-flash", "input": "hi", "max_output_tokens": 0, "stream": True},
     "P17", "max_output_tokens"),
    ("/beta/completions", {"model": "deepseek-flash", "prompt": "def f(", "max_tokens": 0, "stream": True},
     "F6", "max_tokens"),
    ("/anthropic/v1/messages", {"model": "deepseek-flash", "max_tokens": 0, "stream": True,
                                "messages": [{"role": "user", "content": "hi"}]}, "A2", "max_tokens"),
])
def test_a_confirmed_rule_deepseek_later_accepts_is_disputed_once_the_period_is_over(
        start: Callable[..., RunningChatgate], fake: RunningFake, path: str, body: dict[str, Any], rule: str,
        words: str) -> None:
    clock = Clock()
    gate = start(clock)
    assert post(gate, body, path).status_code == 400
    assert rule_row(gate, rule)["status"] == "enforced"
    fake.state.configure(accept_refusals=[words])
    clock.now += 3601
    streamed = post(gate, body, path)
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.content == bytes(fake.state.requests[-1].sent)  # relayed byte for byte
    assert rule in streamed.headers["x-chatgate-warning"]
    assert rule_row(gate, rule)["status"] == "disputed"
    assert post(gate, body, path).status_code == 200  # forwarded with its warning from now on
    assert len(fake.state.requests) == 3
