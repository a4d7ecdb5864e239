"""DeepSeek's Anthropic-format route through a real chatgate, driven by the real `anthropic` SDK (as Claude
Code is): forwarded byte for byte, streamed event by event, refused in Anthropic's error shape, repaired,
metered per key with DeepSeek's usage (cache reads are hits), in both auth modes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import orjson
import pytest

from chatgate.gateway.auth import new_key
from tests.fakes.server import RunningFake
from tests.gateway.conftest import usage_rows
from tests.harness import RunningChatgate

KEY = "sk-claude-code-user-0001"
TOOL: dict[str, Any] = {"name": "Read", "description": "Read a file.",
                        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}
SYSTEM = [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}]


def client(gate: RunningChatgate, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gate.url + "/anthropic", api_key=key, max_retries=0, timeout=20)


def post(gate: RunningChatgate, body: dict[str, Any] | bytes, path: str = "/anthropic/v1/messages",
         **headers: str) -> httpx2.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    h = {"content-type": "application/json", "x-api-key": KEY, "anthropic-version": "2023-06-01", **headers}
    return httpx2.post(gate.url + path, content=content, headers=h, timeout=20)


def test_the_sdk_gets_thinking_and_text_and_the_body_arrives_byte_for_byte(gate: RunningChatgate,
                                                                          fake: RunningFake) -> None:
    message = client(gate).messages.create(model="claude-sonnet-5-0", max_tokens=1024, system=SYSTEM,
                                           messages=[{"role": "user", "content": "Hello"}])
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[1].text == "Answer 1: the fake DeepSeek says hello."  # type: ignore[union-attr]
    assert message.model == "deepseek-flash"
    raw = (b'{"model":"claude-sonnet-5-0","max_tokens":99,  "messages":[{"role":"user","content":"Hi"}],'
           b'"context_management":{"edits":[{"type":"clear_thinking_20251015"}]},"x_unknown":[1,2]}')
    resp = post(gate, raw, **{"anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"})
    assert resp.status_code == 200 and "x-chatgate-repaired" not in resp.headers
    fake.state.wait_idle(5)
    forwarded = fake.state.requests[-1]
    assert forwarded.body == raw and forwarded.path == "/anthropic/v1/messages"
    assert forwarded.headers["anthropic-beta"] == "claude-code-20250219,interleaved-thinking-2025-05-14"
    assert forwarded.headers["x-api-key"] == KEY


def test_claude_codes_query_string_and_the_short_path(gate: RunningChatgate, fake: RunningFake) -> None:
    body = {"model": "claude-haiku-5-0", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]}
    assert post(gate, body, path="/anthropic/v1/messages?beta=true").status_code == 200
    assert post(gate, body, path="/anthropic/messages").status_code == 200
    fake.state.wait_idle(5)
    assert [r.path for r in fake.state.requests] == ["/anthropic/v1/messages"] * 2


def test_async_client_and_stream_relay_named_events(gate: RunningChatgate, fake: RunningFake) -> None:
    async def go() -> tuple[list[str], Any]:
        sdk = anthropic.AsyncAnthropic(base_url=gate.url + "/anthropic", api_key=KEY, max_retries=0)
        async with sdk as c, c.messages.stream(model="claude-opus-5-0", max_tokens=1024,
                                     messages=[{"role": "user", "content": "Hello"}]) as stream:
            kinds = [event.type async for event in stream]
            return kinds, await stream.get_final_message()

    kinds, final = asyncio.run(go())
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "thinking" in kinds and "text" in kinds
    assert final.model == "deepseek-v4-pro" and final.usage.output_tokens > 0
    fake.state.wait_idle(5)
    rec = fake.state.requests[-1]
    assert rec.completed


def test_a_streamed_answer_reaches_the_client_as_the_fake_sent_it(gate: RunningChatgate,
                                                                  fake: RunningFake) -> None:
    body = {"model": "claude-sonnet-5-0", "max_tokens": 512, "stream": True, "tools": [TOOL],
            "messages": [{"role": "user", "content": "Read it"}]}
    with httpx2.stream("POST", gate.url + "/anthropic/v1/messages", content=orjson.dumps(body),
                       headers={"content-type": "application/json", "x-api-key": KEY}, timeout=20) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        received = resp.read()
    fake.state.wait_idle(5)
    assert received == bytes(fake.state.requests[-1].sent)
    assert b"event: message_stop" in received and b"[DONE]" not in received


# --- refusals in Anthropic's shape -------------------------------------------------------------------

REFUSED: list[Any] = [
    pytest.param({"model": "claude-sonnet-5-0", "messages": [{"role": "user", "content": "hi"}]},
                 "max_tokens", "missing_required_parameter", id="A2-no-max_tokens"),
    pytest.param({"model": "claude-sonnet-5-0", "max_tokens": 10, "messages": [
        {"role": "user", "content": "hi"}, {"role": "tool", "content": "42"}]},
                 "messages[1].role", "invalid_role", id="A3-tool-role"),
    pytest.param({"model": "claude-sonnet-5-0", "max_tokens": 10, "tools": [TOOL], "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "x"},
                                          {"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
        {"role": "user", "content": "never mind"}]},
                 "messages[1].content", "tool_use_unanswered", id="A7-unanswered"),
    pytest.param({"model": "claude-sonnet-5-0", "max_tokens": 10, "tools": [TOOL],
                  "tool_choice": {"type": "tool", "name": "Read"},
                  "messages": [{"role": "user", "content": "go"}]},
                 "tool_choice", "tool_choice_in_thinking", id="A13-forced-choice"),
    pytest.param({"model": "claude-opus-5-0", "max_tokens": 10, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}]}]},
                 "messages[0].content[0]", "image_not_supported", id="A16-image-on-pro"),
]


@pytest.mark.parametrize(("body", "param", "code"), REFUSED)
def test_invalid_requests_are_refused_in_anthropics_shape_and_never_reach_deepseek(
        gate: RunningChatgate, fake: RunningFake, tmp_path: Path, body: dict[str, Any], param: str,
        code: str) -> None:
    resp = post(gate, body)
    assert resp.status_code == 400
    envelope: Any = resp.json()
    assert envelope["type"] == "error" and envelope["error"]["type"] == "invalid_request_error"
    assert (envelope["error"]["param"], envelope["error"]["code"]) == (param, code)
    assert envelope["error"]["problems"][0]["rule"].startswith("A")
    assert resp.headers["request-id"] == envelope["request_id"]
    assert resp.headers["x-should-retry"] == "false"
    if "max_tokens" in body:  # the SDK itself insists on max_tokens
        with pytest.raises(anthropic.BadRequestError) as caught:
            client(gate).messages.create(**body)
        assert caught.value.status_code == 400 and caught.value.body["error"]["code"] == code  # type: ignore[index]
    assert fake.state.requests == []
    rows = usage_rows(tmp_path, 2 if "max_tokens" in body else 1)
    assert {(r["outcome"], r["rule_code"], r["route"]) for r in rows} == {
        ("rejected", code, "/anthropic/v1/messages")}


def test_the_dry_run_answers_the_same_without_forwarding(gate: RunningChatgate, fake: RunningFake) -> None:
    valid = {"model": "claude-sonnet-5-0", "max_tokens": 10, "metadata": {"user_id": '{"device":"x"}'},
             "messages": [{"role": "user", "content": "hi"}]}
    answer = post(gate, valid, path="/anthropic/v1/messages/validate").json()
    assert answer["valid"] is True and [w["rule"] for w in answer["warnings"]] == ["A15"]
    refused = post(gate, {**valid, "max_tokens": 0}, path="/anthropic/v1/messages/validate")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "max_tokens_out_of_range"
    assert fake.state.requests == []


# --- repairs ----------------------------------------------------------------------------------------


def claude_code_loop(gate: RunningChatgate, rounds: int, stream: bool, strip_thinking: bool
                     ) -> list[tuple[Any, dict[str, str]]]:
    """Claude Code's loop with the SDK; with `strip_thinking` the client drops the thinking blocks from its
    history, as some proxies and compaction do. Returns each answer and its response headers."""
    sdk = client(gate)
    messages: list[dict[str, Any]] = []
    answers = []
    for r in range(rounds):
        messages.append({"role": "user", "content": f"Round {r}: read the file."})
        for _ in range(2):
            kwargs: dict[str, Any] = {"model": "claude-sonnet-5-0", "max_tokens": 2048, "tools": [TOOL],
                                      "system": SYSTEM, "messages": messages}
            if stream:
                with sdk.messages.stream(**kwargs) as s:
                    message = s.get_final_message()
                    headers = dict(s.response.headers)
            else:
                raw = sdk.messages.with_raw_response.create(**kwargs)
                message, headers = raw.parse(), dict(raw.headers)
            answers.append((message, headers))
            blocks = [b.model_dump(exclude_none=True) for b in message.content
                      if not (strip_thinking and b.type == "thinking")]
            messages.append({"role": "assistant", "content": blocks})
            uses = [b for b in message.content if b.type == "tool_use"]
            if not uses:
                break
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": u.id, "content": "def f(): pass"} for u in uses]})
    return answers


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_a_three_round_thinking_tool_loop_works_as_sent(gate: RunningChatgate, fake: RunningFake,
                                                        stream: bool) -> None:
    answers = claude_code_loop(gate, 3, stream, strip_thinking=False)
    assert len(answers) == 6 and answers[-1][0].content[-1].text.startswith("Answer 11: the tool said")
    assert not any("x-chatgate-repaired" in h for _, h in answers)


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_stripped_thinking_blocks_are_restored_from_what_chatgate_relayed_a10(
        gate: RunningChatgate, fake: RunningFake, stream: bool) -> None:
    answers = claude_code_loop(gate, 3, stream, strip_thinking=True)
    assert answers[-1][0].content[-1].text.startswith("Answer 11: the tool said")
    assert answers[1][1]["x-chatgate-repaired"] == "restore_thinking@messages[1]"
    fake.state.wait_idle(5)
    last = orjson.loads(fake.state.requests[-1].body)
    turns = [m for m in last["messages"] if m["role"] == "assistant"
             and any(b["type"] == "tool_use" for b in m["content"])]
    assert len(turns) == 3
    for turn in turns:
        first = turn["content"][0]
        assert first["type"] == "thinking" and first["thinking"].startswith("The user sent")
        assert first.get("signature")  # what DeepSeek sent, signature included


def test_thinking_is_remembered_for_restore_thinking_alone(start_gate: Callable[..., RunningChatgate],
                                                           fake: RunningFake) -> None:
    """Each family's restore repair decides whether its turns are remembered, not chat's."""
    gate = start_gate(repair={"restore_reasoning": False})
    claude_code_loop(gate, 2, False, strip_thinking=True)
    fake.state.wait_idle(5)
    last = orjson.loads(fake.state.requests[-1].body)
    first = next(m for m in last["messages"] if m["role"] == "assistant")["content"][0]
    assert first["type"] == "thinking" and first["thinking"].startswith("The user sent")


def test_a_turn_chatgate_never_saw_gets_the_empty_thinking_block(gate: RunningChatgate,
                                                                 fake: RunningFake) -> None:
    body = {"model": "claude-sonnet-5-0", "max_tokens": 100, "tools": [TOOL], "messages": [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_old", "name": "Read",
                                           "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_old", "content": "x"}]}]}
    resp = post(gate, body)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-chatgate-repaired"] == "restore_thinking@messages[1]"
    fake.state.wait_idle(5)
    assert orjson.loads(fake.state.requests[-1].body)["messages"][1]["content"][0] == {
        "type": "thinking", "thinking": ""}


def test_a_subagent_with_thinking_disabled_and_an_effort_is_repaired_a12(gate: RunningChatgate,
                                                                         fake: RunningFake) -> None:
    body = {"model": "claude-haiku-5-0", "max_tokens": 100, "thinking": {"type": "disabled"},
            "output_config": {"effort": "max"}, "messages": [{"role": "user", "content": "summarise"}]}
    resp = post(gate, body)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-chatgate-repaired"] == "thinking_conflict@output_config.effort"
    fake.state.wait_idle(5)
    assert "output_config" not in orjson.loads(fake.state.requests[-1].body)


def test_opt_in_repairs_for_claude_code_shapes(start_gate: Callable[..., RunningChatgate],
                                                fake: RunningFake) -> None:
    gate = start_gate(repair={"system_messages": True, "forced_tool_choice": True, "model_suffix": True,
                              "split_tool_results": True, "empty_assistant": True, "user_id": True,
                              "redacted_thinking": True})
    body = {"model": "deepseek-v4-pro[1m]", "max_tokens": 100, "tools": [TOOL],
            "tool_choice": {"type": "tool", "name": "Read"}, "metadata": {"user_id": '{"session":"a b"}'},
            "messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "Use tools."},
                         {"role": "user", "content": "go"}]}
    resp = post(gate, body)
    assert resp.status_code == 200, resp.text
    assert set(resp.headers["x-chatgate-repaired"].split("; ")) == {
        "model_suffix@model", "forced_tool_choice@thinking", "user_id@metadata.user_id",
        "system_messages@messages[1]"}
    fake.state.wait_idle(5)
    sent = orjson.loads(fake.state.requests[-1].body)
    assert sent["model"] == "deepseek-v4-pro" and sent["system"] == [{"type": "text", "text": "Use tools."}]
    assert sent["thinking"] == {"type": "disabled"} and len(sent["messages"]) == 2


# --- metering and keys -----------------------------------------------------------------------------


def test_usage_is_metered_per_key_as_deepseek_issued_it(gate: RunningChatgate, fake: RunningFake,
                                                       tmp_path: Path) -> None:
    keys = ("sk-team-red-0001", "sk-team-blue-002")
    for n, key in enumerate(keys * 2):
        sdk = client(gate, key)
        model = ("claude-sonnet-5-0", "claude-opus-5-0")[n % 2]
        if n < 2:
            sdk.messages.create(model=model, max_tokens=256, messages=[{"role": "user", "content": f"q{n}"}])
        else:
            with sdk.messages.stream(model=model, max_tokens=256,
                                     messages=[{"role": "user", "content": f"q{n}"}]) as s:
                s.get_final_message()
    rows = usage_rows(tmp_path, 4)
    fake.state.wait_idle(5)
    for key in keys:
        issued = fake.state.issued_usage[key]
        mine = [r for r in rows if r["key_id"] == rows_key(key)]
        assert len(mine) == 2
        assert sum(r["prompt_tokens"] for r in mine) == issued["prompt_tokens"]
        assert sum(r["prompt_cache_hit_tokens"] for r in mine) == issued["cache_read_input_tokens"]
        assert sum(r["prompt_cache_miss_tokens"] for r in mine) == issued["input_tokens"]
        assert sum(r["completion_tokens"] for r in mine) == issued["output_tokens"]
    assert {r["model"] for r in rows} == {"deepseek-flash", "deepseek-v4-pro"}, "the model DeepSeek served"
    assert all(r["route"] == "/anthropic/v1/messages" and r["tokens_exact"] == 1 for r in rows)
    assert all(r["cost_picousd"] > 0 for r in rows)


def rows_key(secret: str) -> str:
    from chatgate.gateway.auth import fingerprint
    return fingerprint(secret)


def test_managed_keys_work_by_x_api_key_and_never_reach_deepseek(start_gate: Callable[..., RunningChatgate],
                                                                 fake: RunningFake) -> None:
    gate = start_gate(auth={"mode": "managed", "upstream_api_key": "sk-house-key"})
    key_id, secret, digest, prefix = new_key()
    gate.state.store.create_key(key_id, digest, prefix, "platform", "claude-code")
    message = client(gate, secret).messages.create(model="claude-sonnet-5-0", max_tokens=64,
                                                   messages=[{"role": "user", "content": "hi"}])
    assert message.content
    fake.state.wait_idle(5)
    headers = fake.state.requests[-1].headers
    assert headers["authorization"] == "Bearer sk-house-key" and "x-api-key" not in headers
    with pytest.raises(anthropic.AuthenticationError) as caught:
        client(gate, "cg-not-a-key").messages.create(model="claude-sonnet-5-0", max_tokens=64,
                                                     messages=[{"role": "user", "content": "hi"}])
    assert caught.value.body["type"] == "error"  # type: ignore[index]


def test_count_tokens_is_chatgates_own_count(gate: RunningChatgate, fake: RunningFake) -> None:
    body = {"model": "claude-sonnet-5-0", "system": "You are Claude Code.", "tools": [TOOL],
            "messages": [{"role": "user", "content": "Hello there, how are you?"}]}
    counted = client(gate).messages.count_tokens(**body)  # type: ignore[arg-type]
    assert 10 < counted.input_tokens < 200
    bigger = client(gate).messages.count_tokens(**{**body, "messages": [
        {"role": "user", "content": "Hello there, how are you? " * 50}]})  # type: ignore[arg-type]
    assert bigger.input_tokens > counted.input_tokens + 200
    assert fake.state.requests == [], "answered locally"
    assert post(gate, b"{", path="/anthropic/v1/messages/count_tokens").status_code == 400


def test_a_broken_stream_ends_with_an_anthropic_error_event(gate: RunningChatgate, fake: RunningFake) -> None:
    body = {"model": "claude-sonnet-5-0", "max_tokens": 512, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    with httpx2.stream("POST", gate.url + "/anthropic/v1/messages", content=orjson.dumps(body),
                       headers={"content-type": "application/json", "x-api-key": KEY,
                                "x-fake-fault": "reset_mid_stream"}, timeout=20) as resp:
        received = resp.read()
    tail = received.rstrip().split(b"\n\n")[-1]
    assert tail.startswith(b"event: error\ndata: ")
    assert json.loads(tail.split(b"data: ", 1)[1])["error"]["type"] == "api_error"


def test_a_body_over_the_limit_is_a_413_in_anthropics_shape_a21(start_gate: Callable[..., RunningChatgate],
                                                                 fake: RunningFake) -> None:
    gate = start_gate(limits={"max_body_bytes": 4096})
    big = {"model": "claude-sonnet-5-0", "max_tokens": 64,
           "messages": [{"role": "user", "content": "x" * 8000}]}
    with pytest.raises(anthropic.APIStatusError) as caught:
        client(gate).messages.create(**big)  # type: ignore[arg-type]
    err = caught.value
    assert err.status_code == 413
    assert err.body["type"] == "error" and err.body["error"]["type"] == "request_too_large"  # type: ignore[index]
    assert fake.state.requests == []
