"""The request path in-process (tests/inprocess/gate.py): chat streamed and not, a refusal, a repair, a
retry after a 503, the usage record, a budget refusal, the Anthropic and Responses routes."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from chatgate.demo.deepseek import FakeState
from chatgate.gateway.auth import fingerprint, new_key
from chatgate.gateway.ledger import Ledger
from chatgate.gateway.proxy import Gateway
from chatgate.store import open_store
from chatgate.store.base import LimitRow
from tests.inprocess.gate import KEY, Gate, chat, events, run
from tests.repair.clients import SEARCH, tool_calls_of


def test_the_app_is_wired_by_one_builder(tmp_path: Path) -> None:
    async def scenario(g: Gate) -> None:
        gw = g.state.gw
        assert isinstance(gw, Gateway) and isinstance(gw.ledger, Ledger)
        assert gw.auth.on_refused == g.state.metrics.auth_failure
        assert gw.ledger.background is gw.background
        assert gw.tracing is g.state.tracing and gw.refusals is g.state.refusals

    run(tmp_path, scenario)


def test_a_chat_answer_is_relayed_as_deepseek_sent_it_and_recorded(tmp_path: Path) -> None:
    async def scenario(g: Gate) -> None:
        resp = await g.post("/v1/chat/completions", chat(max_tokens=16))
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["message"]["content"]
        assert resp.content == bytes(g.fake.requests[-1].sent), "relayed byte for byte"
        assert g.fake.requests[-1].body == orjson.dumps(chat(max_tokens=16)), "forwarded byte for byte"
        [row] = await g.records(1)
        usage = resp.json()["usage"]
        assert (row["outcome"], row["route"], row["stream"]) == ("ok", "/v1/chat/completions", 0)
        assert (row["prompt_tokens"], row["completion_tokens"]) == (usage["prompt_tokens"],
                                                                    usage["completion_tokens"])
        assert row["key_id"] == fingerprint(KEY) and row["cost_picousd"] > 0 and row["tokens_exact"] == 1

    run(tmp_path, scenario)


def test_a_stream_is_relayed_whole_and_metered_from_its_last_event(tmp_path: Path) -> None:
    async def scenario(g: Gate) -> None:
        resp = await g.post("/v1/chat/completions", chat(stream=True, stream_options={"include_usage": True}))
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        assert resp.text.rstrip().endswith("data: [DONE]")
        usage = events(resp.text)[-1]["usage"]
        [row] = await g.records(1)
        assert (row["outcome"], row["stream"], row["prompt_tokens"]) == ("ok", 1, usage["prompt_tokens"])

    run(tmp_path, scenario)


def test_a_request_deepseek_would_refuse_gets_a_400_and_is_not_forwarded(tmp_path: Path) -> None:
    async def scenario(g: Gate) -> None:
        resp = await g.post("/v1/chat/completions", chat(max_tokens="many"))
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == "max_tokens"
        assert g.fake.requests == []
        [row] = await g.records(1)
        assert (row["outcome"], row["prompt_tokens"]) == ("rejected", 0)

    run(tmp_path, scenario)


def test_dropped_reasoning_is_restored_in_the_next_round(tmp_path: Path) -> None:
    async def scenario(g: Gate) -> None:
        messages = [{"role": "user", "content": "Umbrella in Lisbon today?"}]
        first = await g.post("/v1/chat/completions", {"model": "deepseek-flash", "messages": messages,
                                                      "tools": [SEARCH]})
        assert first.status_code == 200, first.text
        calls = tool_calls_of(first, stream=False)  # type: ignore[arg-type]
        messages += [{"role": "assistant", "content": "", "tool_calls": calls},
                     *({"role": "tool", "tool_call_id": c["id"], "content": "rain"} for c in calls),
                     {"role": "user", "content": "and tomorrow?"}]
        second = await g.post("/v1/chat/completions", {"model": "deepseek-flash", "messages": messages,
                                                       "tools": [SEARCH]})
        assert second.status_code == 200, second.text
        assert second.headers["x-chatgate-repaired"] == "restore_reasoning@messages[1]"
        forwarded = orjson.loads(g.fake.requests[-1].body)
        assert forwarded["messages"][1]["reasoning_content"]
        rows = await g.records(2)
        assert rows[1]["repairs"] == "restore_reasoning"

    run(tmp_path, scenario)


def test_a_503_is_retried_and_the_record_counts_the_attempts(tmp_path: Path) -> None:
    async def scenario(g: Gate) -> None:
        resp = await g.post("/v1/chat/completions", chat(), **{"x-fake-fault": "http_503",
                                                               "x-fake-fault-attempts": "1"})
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-chatgate-attempts"] == "2"
        assert len(g.fake.requests) == 2
        [row] = await g.records(1)
        assert (row["outcome"], row["attempts"]) == ("ok", 2)

    run(tmp_path, scenario, upstream={"retries": 2, "retry_base_ms": 1})


def test_a_503_that_lasts_is_deepseeks_answer_once_the_retries_are_spent(tmp_path: Path) -> None:
    async def scenario(g: Gate) -> None:
        resp = await g.post("/v1/chat/completions", chat(), **{"x-fake-fault": "http_503"})
        assert resp.status_code == 503
        assert resp.headers["x-should-retry"] == "false"
        assert "3 attempts" in resp.json()["error"]["message"]
        [row] = await g.records(1)
        assert (row["outcome"], row["upstream_status"], row["attempts"]) == ("upstream_error", 503, 3)

    run(tmp_path, scenario, upstream={"retries": 2, "retry_base_ms": 1})


def test_a_spent_budget_refuses_with_insufficient_quota(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/usage.db")
    store.migrate()
    store.set_limits(LimitRow("key", fingerprint(KEY), budget_picousd=1, budget_period="day"))
    store.close()

    async def scenario(g: Gate) -> None:
        resp = await g.post("/v1/chat/completions", chat(max_tokens=16))
        assert resp.status_code == 429
        assert resp.json()["error"]["code"] == "insufficient_quota"
        assert resp.headers["x-should-retry"] == "false"
        assert g.fake.requests == []
        [row] = await g.records(1)
        assert (row["outcome"], row["rule_code"]) == ("limited", "budget:key")

    run(tmp_path, scenario)


def test_the_anthropic_route_streams_and_refuses_in_anthropics_shape(tmp_path: Path) -> None:
    body = {"model": "deepseek-flash", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]}

    async def scenario(g: Gate) -> None:
        resp = await g.post("/anthropic/v1/messages", body, **{"anthropic-version": "2023-06-01"})
        assert resp.status_code == 200, resp.text
        assert resp.json()["type"] == "message"
        streamed = await g.post("/anthropic/v1/messages", {**body, "stream": True},
                                **{"anthropic-version": "2023-06-01"})
        assert "event: message_stop" in streamed.text
        refused = await g.post("/anthropic/v1/messages", {**body, "max_tokens": -1},
                               **{"anthropic-version": "2023-06-01"})
        assert refused.status_code == 400
        assert refused.json()["type"] == "error"
        assert refused.json()["error"]["type"] == "invalid_request_error"
        rows = await g.records(3)
        assert [(r["route"], r["outcome"]) for r in rows] == [
            ("/anthropic/v1/messages", "ok"), ("/anthropic/v1/messages", "ok"),
            ("/anthropic/v1/messages", "rejected")]

    run(tmp_path, scenario)


def test_the_responses_route_answers_and_is_metered(tmp_path: Path) -> None:
    async def scenario(g: Gate) -> None:
        resp = await g.post("/v1/responses", {"model": "deepseek-flash", "input": "Hi"})
        assert resp.status_code == 200, resp.text
        assert resp.json()["object"] == "response"
        [row] = await g.records(1)
        assert (row["route"], row["outcome"]) == ("/responses", "ok") and row["prompt_tokens"] > 0

    run(tmp_path, scenario)


def test_a_tool_api_call_is_relayed_and_billed_one_call(tmp_path: Path) -> None:
    async def scenario(g: Gate) -> None:
        resp = await g.post("/v1/tools/search", {"query": "deepseek", "count": 2})
        assert resp.status_code == 200, resp.text
        assert len(resp.json()["results"]) == 2
        assert resp.headers["content-length"] == str(len(resp.content))
        [row] = await g.records(1)
        assert (row["model"], row["outcome"], row["billed_units"], row["billed_unit"]) == (
            "search", "ok", 1, "call")

    run(tmp_path, scenario)


def test_managed_mode_sends_a_request_refused_for_balance_to_another_account(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = {"one": "sk-account-one-0001", "two": "sk-account-two-0002"}
    for name, key in keys.items():
        monkeypatch.setenv(f"DEEPSEEK_KEY_{name.upper()}", key)
    store = open_store(f"sqlite:///{tmp_path}/usage.db")
    store.migrate()
    key_id, secret, digest, prefix = new_key()
    store.create_key(key_id, digest, prefix, "search", "crawler")
    store.close()
    fake = FakeState()
    fake.configure(no_balance_keys=[keys["two"]])

    async def scenario(g: Gate) -> None:
        statuses = [(await g.post("/v1/chat/completions", chat(), key=secret)).status_code for _ in range(4)]
        assert statuses == [200] * 4
        assert {r.auth_key for r in g.fake.requests} == set(keys.values())
        assert [r.auth_key for r in g.fake.requests].count(keys["two"]) == 1, "set aside after its 402"
        rows = await g.records(4)
        assert sorted(r["attempts"] for r in rows) == [1, 1, 1, 2]
        assert {r["account"] for r in rows} == {"one"}

    accounts = [{"name": name, "key_env": f"DEEPSEEK_KEY_{name.upper()}"} for name in keys]
    run(tmp_path, scenario, fake, auth={"mode": "managed", "key_cache_seconds": 0},
        upstream={"accounts": accounts, "retries": 2, "retry_base_ms": 1})
