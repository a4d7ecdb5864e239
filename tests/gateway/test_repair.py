"""Repairs through a real chatgate in front of the fake DeepSeek: the dropped reasoning_content restored for
the same caller (streamed and not), refused for another, shown everywhere (header, /validate, the usage
record, /metrics, the access log); each opt-in repair end to end; a valid body still forwarded as sent."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import orjson
import pytest

from chatgate.gateway.auth import fingerprint, hash_key
from chatgate.repair.turncache import TurnCache, _read, _records
from chatgate.store.base import TurnRow
from tests.fakes.server import RunningFake
from tests.gateway.conftest import JSON_HEADERS, chat_body, usage_rows
from tests.harness import RunningChatgate
from tests.metering.helpers import usage_json
from tests.repair import clients
from tests.repair.clients import KEY, SEARCH, tool_calls_of


def post(gate: RunningChatgate, body: dict[str, Any], key: str | None = KEY,
         path: str = "/v1/chat/completions", **headers: str) -> httpx2.Response:
    return clients.post(gate.url, body, key, path, **headers)


def dropping_loop(gate: RunningChatgate, rounds: int, stream: bool, key: str = KEY) -> list[httpx2.Response]:
    return clients.dropping_loop(gate.url, rounds, stream, key)


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_dropped_reasoning_is_restored_for_the_same_caller_r17(gate: RunningChatgate, fake: RunningFake,
                                                             tmp_path: Path, stream: bool) -> None:
    answers = dropping_loop(gate, rounds=3, stream=stream)
    assert "x-chatgate-repaired" not in answers[0].headers, "the first request needed nothing"
    assert answers[1].headers["x-chatgate-repaired"] == "restore_reasoning@messages[1]"
    assert answers[2].headers["x-chatgate-repaired"] == (
        "restore_reasoning@messages[1]; restore_reasoning@messages[4]")
    fake.state.wait_idle(5)
    sent = [orjson.loads(r.body) for r in fake.state.requests]
    relayed = [m for m in sent[2]["messages"] if m["role"] == "assistant"]
    assert [m["reasoning_content"] for m in relayed] == ["The user sent 1 messages; I will answer.",
                                                         "The user sent 4 messages; I will answer."]
    rows = usage_rows(tmp_path, 3)
    assert [r["repairs"] for r in rows] == [None, "restore_reasoning", "restore_reasoning"]
    metrics = httpx2.get(gate.url + "/metrics").text
    assert 'chatgate_repairs_total{code="restore_reasoning"} 2.0' in metrics


def test_usage_by_repair_counts_each_request_under_each_of_its_repairs(gate: RunningChatgate,
                                                                       tmp_path: Path) -> None:
    dropping_loop(gate, rounds=2, stream=False)
    assert post(gate, chat_body(thinking={"type": "disabled"}, reasoning_effort="low")).status_code == 200
    usage_rows(tmp_path, 3)
    report = usage_json(f"sqlite:///{tmp_path}/usage.db", "repair")
    assert [(r["repair"], r["requests"]) for r in report["rows"]] == [
        ("", 1), ("restore_reasoning", 1), ("thinking_conflict", 1)]
    assert report["totals"]["requests"] == 3


def test_another_key_replaying_the_ids_gets_the_400_and_no_reasoning(gate: RunningChatgate,
                                                                    fake: RunningFake) -> None:
    first = dropping_loop(gate, rounds=1, stream=False)[0]
    calls = tool_calls_of(first, stream=False)
    history = [{"role": "user", "content": "Umbrella in Lisbon today?"},
               {"role": "assistant", "content": "", "tool_calls": calls},
               {"role": "tool", "tool_call_id": calls[0]["id"], "content": "rain"}]
    before = len(fake.state.requests)
    body = {"model": "deepseek-flash", "messages": history, "tools": [SEARCH]}
    refused = post(gate, body, key="sk-someone-else-0002")
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("reasoning_content_missing", "messages[1].reasoning_content")
    assert "could not restore it: it has no record of this turn for your key" in error["message"]
    assert "The user sent" not in refused.text, "another caller's reasoning never leaks"
    assert len(fake.state.requests) == before
    assert post(gate, body).status_code == 200, "the caller it belongs to still gets it restored"


def test_a_passthrough_callers_turns_are_keyed_by_its_whole_key_hash_not_its_fingerprint(
        gate: RunningChatgate) -> None:
    """Reports and logs show a passthrough key's 48-bit fingerprint; a token with the same fingerprint is
    cheap to find, so the memory of turns is keyed by the key's whole hash."""
    dropping_loop(gate, rounds=1, stream=False)
    callers = {row.caller for row in remembered(gate)}
    assert callers == {"pt-" + hash_key(KEY)}
    assert fingerprint(KEY) not in callers


def remembered(gate: RunningChatgate) -> list[TurnRow]:
    """The turns in the gate's cache, read out of its ring."""
    cache = gate.state.gw.memory._cache
    assert cache._ring is not None
    rows = []
    for _, at in _records(cache._ring, cache.size):
        key, turn_id, names, payload, expires = _read(cache._ring, at)
        caller, kind, call_id = key.split("\x00")
        rows.append(TurnRow(caller, kind, call_id, turn_id, names, payload, expires))
    return rows


def test_a_call_without_tools_replaying_the_history_is_restored_or_forwarded_with_a_warning_r17(
        gate: RunningChatgate, fake: RunningFake) -> None:
    """A title or compaction call sends the agent's history without `tools`: R17 is then only a warning
    (docs/rules-chat.md U3), and the remembered reasoning is still put back (the warning goes with it)."""
    first = dropping_loop(gate, rounds=1, stream=False)[0]
    calls = tool_calls_of(first, stream=False)
    body = {"model": "deepseek-flash", "messages": [
        {"role": "user", "content": "Umbrella in Lisbon today?"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "rain"},
        {"role": "assistant", "content": "Take one."},
        {"role": "user", "content": "Give this conversation a short title."}]}
    resp = post(gate, body)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-chatgate-repaired"] == "restore_reasoning@messages[1]"
    assert "x-chatgate-warning" not in resp.headers
    fake.state.wait_idle(5)
    forwarded = orjson.loads(fake.state.requests[-1].body)
    assert forwarded["messages"][1]["reasoning_content"] == "The user sent 1 messages; I will answer."
    stranger = post(gate, body, key="sk-someone-else-0002", path="/v1/chat/completions/validate")
    answer = stranger.json()
    assert stranger.status_code == 200 and answer["valid"] is True
    assert [(w["code"], w["rule"]) for w in answer["warnings"]] == [("reasoning_content_missing", "R17")]
    assert "The user sent" not in stranger.text, "another caller's reasoning never leaks"


def test_changed_tool_calls_are_not_restored(gate: RunningChatgate) -> None:
    first = dropping_loop(gate, rounds=1, stream=False)[0]
    calls = tool_calls_of(first, stream=False)
    calls[0]["function"]["name"] = "another_tool"
    body = {"model": "deepseek-flash", "tools": [SEARCH], "messages": [
        {"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "rain"}]}
    refused = post(gate, body)
    assert refused.status_code == 400
    assert "the tool calls differ from the answer chatgate relayed" in refused.json()["error"]["message"]


def test_a_turn_the_cache_does_not_hold_is_restored_from_the_store(gate: RunningChatgate) -> None:
    """The cache answers the common case alone; a turn it does not hold (another process wrote it to the
    store) is looked up in the store, and a turn none holds is refused while the others of the request are
    still restored."""
    agent = clients.DroppingAgent()
    assert agent.round(gate.url, stream=False).status_code == 200
    memory, store = gate.state.gw.memory, gate.state.store
    assert memory.durable and store is not None
    rows = remembered(gate)
    assert len(rows) == 1 and store.recall_turns(rows[0].caller, "chat", [rows[0].call_id], 0) == []
    store.remember_turns(rows)
    memory.close()
    memory._cache = TurnCache(memory.cache_bytes)  # this process forgets; the store remembers
    assert agent.round(gate.url, stream=False).headers["x-chatgate-repaired"] == \
        "restore_reasoning@messages[1]"
    assert agent.round(gate.url, stream=False).headers["x-chatgate-repaired"] == \
        "restore_reasoning@messages[1]; restore_reasoning@messages[4]"

    stranger = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_never_relayed", "type": "function",
         "function": {"name": "search_forecast", "arguments": "{}"}}]}
    body = agent.body(stream=False)
    body["messages"] = [*body["messages"], stranger,
                        {"role": "tool", "tool_call_id": "call_never_relayed", "content": "?"}]
    refused = post(gate, body)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == f"messages[{len(body['messages']) - 2}].reasoning_content"
    assert "could not restore it: it has no record of this turn for your key" in error["message"]
    assert [r["path"] for r in error["repairs"]] == ["messages[1]", "messages[4]", "messages[7]"]
    metrics = httpx2.get(gate.url + "/metrics").text
    assert "chatgate_reasoning_restore_misses_total 1.0" in metrics, "one turn missed, counted once"


def test_a_restored_body_is_the_clients_bytes_with_only_the_reasoning_inserted_r17(
        gate: RunningChatgate, fake: RunningFake) -> None:
    """The common restore is done on the bytes: DeepSeek gets the client's own spacing, key order and
    escapes, with `"reasoning_content":…,` in front of the turn's tool_calls."""
    first = dropping_loop(gate, rounds=1, stream=False)[0]
    calls = tool_calls_of(first, stream=False)
    call_id = json.dumps(calls[0]["id"])
    text = ("{\n  \"messages\": [{\"content\": \"Regenschirm in M\\u00fcnchen? 日本\", \"role\": \"user\"},\n"
            "    {\"tool_calls\": " + json.dumps(calls) + ", \"role\": \"assistant\", \"content\": null},\n"
            "    {\"role\": \"tool\", \"tool_call_id\": " + call_id + ", \"content\": \"rain\"}],\n"
            "  \"model\": \"deepseek-flash\", \"tools\": [" + json.dumps(SEARCH) + "]\n}")
    body = text.encode()
    resp = httpx2.post(gate.url + "/v1/chat/completions", content=body, timeout=10,
                       headers={**JSON_HEADERS, "authorization": f"Bearer {KEY}"})
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-chatgate-repaired"] == "restore_reasoning@messages[1]"
    fake.state.wait_idle(5)
    inserted = b'"reasoning_content":"The user sent 1 messages; I will answer.",'
    expected = body.replace(b'{"tool_calls": ', b'{' + inserted + b'"tool_calls": ')
    assert fake.state.requests[-1].body == expected


def test_validate_shows_the_repairs_and_the_repaired_body(gate: RunningChatgate, fake: RunningFake) -> None:
    first = dropping_loop(gate, rounds=1, stream=True)[0]
    calls = tool_calls_of(first, stream=True)
    body = {"model": "deepseek-flash", "tools": [SEARCH], "reasoning_effort": "high",
            "thinking": {"type": "enabled"}, "messages": [
                {"role": "user", "content": "Umbrella?"},
                {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "tool_call_id": calls[0]["id"], "content": "rain"}]}
    before = len(fake.state.requests)
    answer = post(gate, body, path="/v1/chat/completions/validate").json()
    assert answer["valid"] is True
    assert answer["repairs"] == [{"code": "restore_reasoning", "path": "messages[1]", "rules": ["R17"]}]
    assert answer["repaired_body"]["messages"][1]["reasoning_content"] == (
        "The user sent 1 messages; I will answer.")
    anonymous = post(gate, body, key=None, path="/v1/chat/completions/validate")
    assert anonymous.status_code == 400
    assert "only for callers that send a key" in anonymous.json()["error"]["message"]
    assert len(fake.state.requests) == before, "the dry run forwards nothing"


def test_a_valid_request_is_forwarded_byte_for_byte_and_unmarked(gate: RunningChatgate,
                                                                  fake: RunningFake) -> None:
    body = (b'{"model":"deepseek-flash", "messages":[{"role":"user","content":"hi"}],'
            b' "thinking": {"type": "disabled"}, "reasoning_effort": "none"}')
    resp = httpx2.post(gate.url + "/v1/chat/completions", content=body, headers=JSON_HEADERS, timeout=10)
    assert resp.status_code == 200 and "x-chatgate-repaired" not in resp.headers
    fake.state.wait_idle(5)
    assert fake.state.requests[-1].body == body


def test_thinking_conflict_is_repaired_by_default_r41(gate: RunningChatgate, fake: RunningFake,
                                                       tmp_path: Path) -> None:
    body = chat_body(thinking={"type": "disabled"}, reasoning_effort="max")
    resp = post(gate, body)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-chatgate-repaired"] == "thinking_conflict@reasoning_effort"
    assert "x-chatgate-warning" not in resp.headers
    fake.state.wait_idle(5)
    assert "reasoning_effort" not in orjson.loads(fake.state.requests[-1].body)
    assert usage_rows(tmp_path, 1)[0]["repairs"] == "thinking_conflict"


def test_repairs_off_leave_r41_a_warning_and_r17_a_400(start_gate: Callable[..., RunningChatgate],
                                                       fake: RunningFake) -> None:
    gate = start_gate(repair={"restore_reasoning": False, "thinking_conflict": False})
    resp = post(gate, chat_body(thinking={"type": "disabled"}, reasoning_effort="max"))
    assert "thinking options type cannot be disabled" in resp.headers["x-chatgate-warning"]
    assert "x-chatgate-repaired" not in resp.headers
    fake.state.wait_idle(5)
    assert orjson.loads(fake.state.requests[-1].body)["reasoning_effort"] == "max", "forwarded unchanged"
    first = dropping_loop(gate, rounds=1, stream=False)[0]
    calls = tool_calls_of(first, stream=False)
    refused = post(gate, {"model": "deepseek-flash", "tools": [SEARCH], "messages": [
        {"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "rain"}]})
    assert refused.status_code == 400 and "could not restore" not in refused.text


# --- every opt-in repair, end to end -----------------------------------------------------------------

ALL_ON = {name: True for name in ("developer_role", "flatten_content", "strip_images", "forced_tool_choice",
                                  "clamp_max_tokens", "user_id", "orphan_tool_messages",
                                  "unanswered_tool_calls")}
CALL = {"id": "call_x1", "type": "function",
        "function": {"name": "search_forecast", "arguments": '{"q":"x"}'}}

OPT_IN: list[Any] = [
    pytest.param({"messages": [{"role": "developer", "content": "Be brief."},
                               {"role": "user", "content": "hi"}]},
                 "developer_role@messages[0]", lambda b: b["messages"][0]["role"] == "system",
                 id="developer_role"),
    pytest.param({"messages": [{"role": "system", "content": [{"type": "text", "text": "a"},
                                                              {"type": "text", "text": "b"}]},
                               {"role": "user", "content": "hi"}]},
                 "flatten_content@messages[0].content", lambda b: b["messages"][0]["content"] == "a\nb",
                 id="flatten_content"),
    pytest.param({"model": "deepseek-v4-pro", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is it?"},
        {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}]}]},
                 "strip_images@messages[0].content[1]",
                 lambda b: b["messages"][0]["content"][1]["type"] == "text", id="strip_images"),
    pytest.param({"tools": [SEARCH], "tool_choice": "required",
                  "messages": [{"role": "user", "content": "go"}]},
                 "forced_tool_choice@thinking",
                 lambda b: b["thinking"] == {"type": "disabled"} and b["tool_choice"] == "required",
                 id="forced_tool_choice"),
    pytest.param({"max_tokens": 1_000_000, "messages": [{"role": "user", "content": "hi"}]},
                 "clamp_max_tokens@max_tokens", lambda b: b["max_tokens"] == 393_216, id="clamp_max_tokens"),
    pytest.param({"user_id": "alice@example.com", "messages": [{"role": "user", "content": "hi"}]},
                 "user_id@user_id", lambda b: b["user_id"] == "alice_example_com", id="user_id"),
    pytest.param({"thinking": {"type": "disabled"}, "tools": [SEARCH], "messages": [
        {"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "nobody", "content": "x"}]},
                 "orphan_tool_messages@messages[1]", lambda b: len(b["messages"]) == 1,
                 id="orphan_tool_messages"),
    pytest.param({"thinking": {"type": "disabled"}, "tools": [SEARCH], "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "user", "content": "never mind"}]},
                 "unanswered_tool_calls@messages[1].tool_calls",
                 lambda b: b["messages"][2] == {"role": "tool", "tool_call_id": "call_x1",
                                                "content": "no result: the call was interrupted"},
                 id="unanswered_tool_calls"),
]


@pytest.fixture
def repairing(start_gate: Callable[..., RunningChatgate]) -> Iterator[RunningChatgate]:
    yield start_gate(repair=ALL_ON)


@pytest.mark.parametrize(("body", "header", "repaired_as"), OPT_IN)
def test_each_opt_in_repair_end_to_end(repairing: RunningChatgate, fake: RunningFake, tmp_path: Path,
                                       body: dict[str, Any], header: str,
                                       repaired_as: Callable[[dict[str, Any]], bool]) -> None:
    full = {"model": "deepseek-flash", **body}
    resp = post(repairing, full)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-chatgate-repaired"] == header
    fake.state.wait_idle(5)
    forwarded = orjson.loads(fake.state.requests[-1].body)
    assert repaired_as(forwarded), forwarded
    assert usage_rows(tmp_path, 1)[0]["repairs"] == header.split("@")[0]


def test_an_opt_in_repair_is_off_by_default(gate: RunningChatgate, fake: RunningFake) -> None:
    resp = post(gate, {"model": "deepseek-flash", "messages": [{"role": "developer", "content": "x"},
                                                               {"role": "user", "content": "hi"}]})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_role"
    assert fake.state.requests == []


def test_what_repairs_cannot_fix_is_still_a_400_listing_the_repairs(repairing: RunningChatgate,
                                                                    fake: RunningFake) -> None:
    resp = post(repairing, {"model": "deepseek-flash", "n": 2, "max_tokens": 10**6,
                            "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "n_not_supported"
    assert error["repairs"] == [{"code": "clamp_max_tokens", "path": "max_tokens", "rules": ["R27"],
                                 "detail": "1000000 -> 393216"}]
    assert fake.state.requests == []


def test_the_openai_sdk_sees_the_repaired_answer(repairing: RunningChatgate) -> None:
    client = openai.OpenAI(base_url=repairing.url + "/v1", api_key=KEY, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="deepseek-flash", messages=[{"role": "developer", "content": "Be brief."},  # type: ignore[misc, list-item]
                                          {"role": "user", "content": "hi"}])
    assert raw.headers["x-chatgate-repaired"] == "developer_role@messages[0]"
    assert raw.parse().choices[0].message.content


def test_many_repairs_make_one_header_of_bounded_size(repairing: RunningChatgate, fake: RunningFake) -> None:
    """A long history can need a repair per message (a restore per tool-call turn); Node's fetch refuses
    response headers over 16 KB, so the header is cut and counts what it leaves out."""
    messages = [*({"role": "developer", "content": f"rule {k}"} for k in range(400)), {"role": "user"}]
    messages[-1]["content"] = "hi"
    resp = httpx2.post(repairing.url + "/v1/chat/completions", headers=JSON_HEADERS, timeout=10,
                       content=orjson.dumps(chat_body(messages=messages)))
    assert resp.status_code == 200 and len(fake.state.requests) == 1
    header = resp.headers["x-chatgate-repaired"]
    assert header.startswith("developer_role@messages[0]; developer_role@messages[1]; ")
    assert len(header) <= 4096 and header.endswith("more: POST .../validate lists them all)")


def test_a_restored_request_keeps_its_warnings_and_is_what_a_full_check_accepts(gate: RunningChatgate,
                                                                                fake: RunningFake) -> None:
    """After restores alone chatgate does not check the whole body again: what it forwards must be exactly
    what /validate, checking it in full, finds valid with the same warnings."""
    strict = {**SEARCH, "function": {**SEARCH["function"], "strict": True}}  # R32: a warning off /beta
    first = post(gate, {"model": "deepseek-flash", "tools": [strict],
                        "messages": [{"role": "user", "content": "Umbrella in Lisbon today?"}]})
    calls = tool_calls_of(first, stream=False)
    history = [{"role": "user", "content": "Umbrella in Lisbon today?"},
               {"role": "assistant", "content": "", "tool_calls": calls},
               {"role": "tool", "tool_call_id": calls[0]["id"], "content": "rain"}]
    second = post(gate, {"model": "deepseek-flash", "tools": [strict], "messages": history})
    assert second.status_code == 200, second.text
    assert second.headers["x-chatgate-repaired"] == "restore_reasoning@messages[1]"
    assert "only enforced on DeepSeek's /beta" in second.headers["x-chatgate-warning"]
    fake.state.wait_idle(5)
    forwarded = fake.state.requests[-1].body
    checked = httpx2.post(gate.url + "/v1/chat/completions/validate", content=forwarded,
                          headers={"content-type": "application/json", "authorization": f"Bearer {KEY}"})
    assert checked.json()["valid"] is True and not checked.json().get("repairs")
    assert [w["rule"] for w in checked.json()["warnings"]] == ["R32"]


def test_another_callers_many_turns_do_not_push_a_callers_turn_out(start_gate: Callable[..., RunningChatgate],
                                                                   fake: RunningFake) -> None:
    """Issue 48: one tenant relaying many tool-call turns flushed the shared memory, and another's next round
    was a 400 instead of a repair. Each tenant (here a passthrough caller) has a fair share of the memory;
    140 turns of caller B in a memory that holds about 90 leave caller A's turn in it."""
    gate = start_gate(repair={"reasoning_cache_bytes": 16 * 1024})
    a = clients.DroppingAgent("sk-tenant-a-0001")
    assert a.round(gate.url, stream=False).status_code == 200
    for _ in range(140):
        assert clients.DroppingAgent("sk-tenant-b-0001").round(gate.url, stream=False).status_code == 200
    resp = a.round(gate.url, stream=False)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-chatgate-repaired"] == "restore_reasoning@messages[1]"
