"""What Claude Code and Codex send, through a chatgate with its default settings (issue 33): the system
message inside `messages` merged (visibly), quiet where the caller cannot act (notices: /metrics and one log
line per key and hour, no x-chatgate-warning), the query string forwarded, unserved routes logged and counted,
Responses records metered by the model DeepSeek says it served."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import httpx2
import orjson
import pytest

from chatgate.errors import Problem
from chatgate.gateway.notices import Notices
from chatgate.metering.metrics import Metrics
from chatgate.metering.reports import build_report, render_table
from chatgate.metering.usage import TokenCounts
from chatgate.store.base import ReportQuery
from chatgate.store.sqlite import SQLiteStore
from tests.fakes.server import RunningFake
from tests.gateway.conftest import usage_rows
from tests.harness import RunningChatgate

KEY = "sk-claude-code-user-0033"
# Claude Code 2.1.332's shape: an environment system message after the first user turn, a JSON user_id.
USER_ID = '{"device_id":"34f9","account_uuid":"","session_id":"95d9f8ab"}'
ENVIRONMENT = {"type": "text", "text": "# Environment\n - Primary working directory: /w",
               "cache_control": {"type": "ephemeral"}}
CLAUDE_CODE_BODY: dict[str, Any] = {
    "model": "claude-opus-5-5", "max_tokens": 128000, "stream": False,
    "thinking": {"type": "adaptive", "display": "omitted"}, "output_config": {"effort": "medium"},
    "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
    "metadata": {"user_id": USER_ID},
    "messages": [{"role": "user", "content": [{"type": "text", "text": "list the files"}]},
                 {"role": "system", "content": [ENVIRONMENT]}],
}
# Codex 0.171.0's tools: functions, a `namespace` of sub-agent tools, web_search.
CODEX_BODY: dict[str, Any] = {
    "model": "deepseek-flash", "stream": False, "store": False,
    "tools": [{"type": "function", "name": "exec_command",
               "parameters": {"type": "object", "properties": {}}},
              {"type": "namespace", "name": "multi_agent_v1", "tools": []}, {"type": "web_search"}],
    "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
}


def post(gate: RunningChatgate, path: str, body: dict[str, Any], **headers: str) -> httpx2.Response:
    h = {"content-type": "application/json", "authorization": f"Bearer {KEY}", **headers}
    return httpx2.post(gate.url + path, content=orjson.dumps(body), headers=h, timeout=20)


def metric(gate: RunningChatgate, name: str, **labels: str) -> float:
    text = httpx2.get(gate.url + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_claude_codes_system_message_is_merged_by_default_and_said_so(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Any) -> None:
    gate = start_gate()
    resp = post(gate, "/anthropic/v1/messages", CLAUDE_CODE_BODY)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-chatgate-repaired"] == "system_messages@messages[1]"
    # the JSON user_id is a notice, not a warning; the pricier model is told once (below)
    assert "user_id" not in resp.headers.get("x-chatgate-warning", ""), resp.headers
    fake.state.wait_idle(5)
    sent = orjson.loads(fake.state.requests[-1].body)
    assert sent["system"] == [*CLAUDE_CODE_BODY["system"], ENVIRONMENT], "appended, block as sent"
    assert [m["role"] for m in sent["messages"]] == ["user"]
    assert sent["metadata"]["user_id"] == USER_ID, "forwarded as sent: DeepSeek accepts it today"
    (row,) = usage_rows(tmp_path, 1)
    assert (row["outcome"], row["repairs"], row["model"]) == ("ok", "system_messages", "deepseek-v4-pro")
    assert metric(gate, "chatgate_repairs_total", code="system_messages") == 1


def test_notices_are_counted_every_time_and_logged_once_per_key_and_hour(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake,
        caplog: pytest.LogCaptureFixture) -> None:
    gate = start_gate()
    with caplog.at_level(logging.WARNING, logger="chatgate"):
        for _ in range(3):
            resp = post(gate, "/v1/responses", CODEX_BODY)
            assert resp.status_code == 200 and "x-chatgate-warning" not in resp.headers, resp.headers
            resp = post(gate, "/anthropic/v1/messages", CLAUDE_CODE_BODY | {"model": "claude-sonnet-5-5"})
            assert resp.status_code == 200 and "x-chatgate-warning" not in resp.headers
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("notice")]
    assert len(said) == 2, said
    assert any("code=unknown_tool_type" in line and "'namespace'" in line for line in said)
    assert any("code=invalid_user_id" in line for line in said)
    assert metric(gate, "chatgate_notices_total", route="/responses", code="unknown_tool_type") == 3
    assert metric(gate, "chatgate_notices_total", route="/anthropic/v1/messages", code="invalid_user_id") == 3
    # what a caller can act on is still a warning on its own request
    other = {**CODEX_BODY, "tools": [*CODEX_BODY["tools"], {"type": "file_search", "vector_store_ids": []}]}
    resp = post(gate, "/v1/responses", other)
    assert "'file_search'" in resp.headers["x-chatgate-warning"]
    # strict mode still refuses the JSON user_id (a notice is a warning)
    strict = start_gate(validation={"strict": True})
    assert post(strict, "/anthropic/v1/messages", CLAUDE_CODE_BODY).status_code == 400


def test_a_notice_is_said_again_after_an_hour_and_per_key() -> None:
    now = [0.0]
    notices = Notices(Metrics(), clock=lambda: now[0])
    problem = Problem("invalid_user_id", "metadata.user_id", "m", "A15", warning=True, notice=True)
    warning = Problem("invalid_effort", "output_config.effort", "w", "A14", warning=True)
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("chatgate").addHandler(handler)
    try:
        assert notices.warnings("/r", "k1", [problem, warning]) == ["w"]
        notices.warnings("/r", "k1", [problem])
        notices.warnings("/r", "k2", [problem])
        now[0] = 3599.0
        notices.warnings("/r", "k1", [problem])
        now[0] = 3600.0
        notices.warnings("/r", "k1", [problem])
    finally:
        logging.getLogger("chatgate").removeHandler(handler)
    assert [("key=k1" in s, "key=k2" in s) for s in said] == [(True, False), (False, True), (True, False)]


def test_the_query_string_goes_on_to_deepseek(start_gate: Callable[..., RunningChatgate],
                                              fake: RunningFake) -> None:
    gate = start_gate()
    body = {"model": "claude-haiku-5-0", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]}
    assert post(gate, "/anthropic/v1/messages?beta=true", body).status_code == 200
    assert post(gate, "/anthropic/v1/messages", body).status_code == 200
    chat = {"model": "deepseek-flash", "messages": [{"role": "user", "content": "Hi"}]}
    assert post(gate, "/v1/chat/completions?a=1&b=%20x", chat).status_code == 200
    fake.state.wait_idle(5)
    assert [(r.path, r.query) for r in fake.state.requests] == [
        ("/anthropic/v1/messages", "beta=true"), ("/anthropic/v1/messages", ""),
        ("/chat/completions", "a=1&b=%20x")]


def test_unserved_routes_are_logged_and_counted_as_unmatched(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake,
        capfd: pytest.CaptureFixture[str]) -> None:
    gate = start_gate(server={"access_log": True})
    probe = httpx2.head(gate.url + "/anthropic", timeout=10)  # Claude Code's start-up probe
    wrong = httpx2.get(gate.url + "/v2/nothing-here", headers={"x-request-id": "req-404"}, timeout=10)
    method = httpx2.get(gate.url + "/anthropic/v1/messages", timeout=10)
    assert (probe.status_code, wrong.status_code, method.status_code) == (404, 404, 405)
    gate.state.gw.ledger.access_log.flush()
    lines = [json.loads(line) for line in capfd.readouterr().out.splitlines()
             if line.startswith('{"event":"request"')]
    assert [(x["route"], x["method"], x["path"], x["status"]) for x in lines] == [
        ("unmatched", "HEAD", "/anthropic", 404), ("unmatched", "GET", "/v2/nothing-here", 404),
        ("unmatched", "GET", "/anthropic/v1/messages", 405)]
    assert lines[1]["request_id"] == "req-404" and lines[0]["outcome"] == "unmatched"
    assert metric(gate, "chatgate_requests_total", route="unmatched", status="404") == 2
    assert metric(gate, "chatgate_requests_total", route="unmatched", status="405") == 1
    assert fake.state.requests == []


@pytest.mark.parametrize("stream", [False, True])
def test_responses_records_carry_the_model_deepseek_served(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Any, stream: bool) -> None:
    gate = start_gate()
    body = {**CODEX_BODY, "model": "deepseek-v4-flash", "stream": stream}
    resp = post(gate, "/v1/responses", body, **{"x-fake-served-model": "deepseek-flash"})
    assert resp.status_code == 200
    (row,) = usage_rows(tmp_path, 1)
    assert row["model"] == "deepseek-flash" and row["prompt_tokens"] > 0


def test_a_model_without_a_price_is_flagged_and_priced_at_the_highest_price(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Any) -> None:
    gate = start_gate()
    priced = post(gate, "/v1/responses", CODEX_BODY)
    unpriced = post(gate, "/v1/responses", CODEX_BODY, **{"x-fake-served-model": "deepseek-v5-preview"})
    assert priced.status_code == unpriced.status_code == 200
    rows = usage_rows(tmp_path, 2)
    by_model = {r["model"]: r for r in rows}
    assert by_model["deepseek-flash"]["cost_picousd"] > 0 and not by_model["deepseek-flash"]["unpriced"]
    new = by_model["deepseek-v5-preview"]
    assert new["unpriced"] and new["cost_picousd"] > 0  # at the catalogue's highest price, never $0
    assert new["cost_picousd"] == gate.state.pricing.cost(TokenCounts(
        new["prompt_tokens"], new["completion_tokens"], new["prompt_cache_hit_tokens"],
        new["prompt_cache_miss_tokens"], new["reasoning_tokens"]), "deepseek-v5-preview", new["ts"])
    assert metric(gate, "chatgate_unpriced_requests_total") == 1
    store = SQLiteStore(tmp_path / "usage.db")
    try:
        report = build_report(store, ReportQuery("team"))
    finally:
        store.close()
    assert report["totals"]["unpriced_requests"] == 1 and report["unpriced_models"] == ["deepseek-v5-preview"]
    table = render_table(report)
    assert ("1 request(s) of models without a price, counted at the catalogue's highest price: "
            "deepseek-v5-preview") in table


def test_claude_codes_models_are_priced_as_the_deepseek_model_serving_them(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Any) -> None:
    """A claude-* name on the Messages route is served by a DeepSeek model (claude-opus* by v4-pro): priced
    as it, with no warning about a missing price (claude-opus* gets the pricier-model notice: below)."""
    gate = start_gate()
    for model in ("claude-sonnet-4-5", "claude-opus-4-1"):
        resp = post(gate, "/anthropic/v1/messages", {**CLAUDE_CODE_BODY, "model": model})
        assert resp.status_code == 200, resp.headers
        assert "no USD price" not in resp.headers.get("x-chatgate-warning", ""), resp.headers
    rows = usage_rows(tmp_path, 2)
    assert all(not r["unpriced"] and r["cost_picousd"] > 0 for r in rows)


def test_claude_codes_default_model_is_told_once_per_key_and_hour_that_it_is_pro(
        start_gate: Callable[..., RunningChatgate], fake: RunningFake, tmp_path: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 50 item 10: `claude-opus-*` is served as deepseek-v4-pro, 3-4x flash's price; the client is told
    once per key and hour in x-chatgate-warning, with the cheaper choice (docs/claude-code.md#models)."""
    gate = start_gate()
    told = []
    with caplog.at_level(logging.WARNING, logger="chatgate"):
        for key in (KEY, KEY, "sk-another-claude-code-user", KEY):
            resp = post(gate, "/anthropic/v1/messages", CLAUDE_CODE_BODY, authorization=f"Bearer {key}")
            assert resp.status_code == 200, resp.text
            told.append(resp.headers.get("x-chatgate-warning"))
        flash = post(gate, "/anthropic/v1/messages", CLAUDE_CODE_BODY | {"model": "claude-sonnet-5-5"},
                     authorization="Bearer sk-a-third-claude-code-user")
        pro = post(gate, "/anthropic/v1/messages", CLAUDE_CODE_BODY | {"model": "deepseek-v4-pro"},
                   authorization="Bearer sk-a-fourth-claude-code-user")
    assert [t is not None for t in told] == [True, False, True, False], told
    assert told[0] is not None and "claude-opus-5-5 is served by DeepSeek as deepseek-v4-pro" in told[0]
    assert "ANTHROPIC_MODEL=deepseek-flash" in told[0] and "user_id" not in told[0]
    assert "x-chatgate-warning" not in flash.headers, "a claude name served as flash: nothing to say"
    assert "x-chatgate-warning" not in pro.headers, "a client that asks for pro by name knows it"
    said = [r.getMessage() for r in caplog.records if "code=pricier_model" in r.getMessage()]
    assert len(said) == 2, said
    assert metric(gate, "chatgate_notices_total", route="/anthropic/v1/messages", code="pricier_model") == 4
    rows = usage_rows(tmp_path, 6)
    assert sorted({r["model"] for r in rows}) == ["deepseek-flash", "deepseek-v4-pro"]
