"""Tests of the fake DeepSeek's Responses API route, over real loopback HTTP, with httpx2 and the openai SDK's
`client.responses`: DeepSeek's 400s with its texts, deterministic answers, the named-event stream with
sequence numbers and no [DONE], usage with cached and reasoning tokens, per-key totals, faults."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import orjson
import pytest

from chatgate.demo.responses import REASONING_MISSING, responses_error
from chatgate.demo.rules import DESERIALIZE
from tests.fakes.server import RunningFake, run_fake_deepseek

KEY = "sk-test-0001"
SHELL: dict[str, Any] = {"type": "function", "name": "shell",
                         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}
ENVELOPE = ("invalid_request_error", None, "invalid_request_error")


@pytest.fixture(scope="module")
def server() -> Iterator[RunningFake]:
    with run_fake_deepseek() as running:
        yield running


@pytest.fixture
def fake(server: RunningFake) -> Iterator[RunningFake]:
    server.state.reset()
    yield server
    server.state.wait_idle(5)
    server.state.reset()


@pytest.fixture
def client(fake: RunningFake) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fake.url, api_key=KEY, max_retries=0, timeout=10) as sdk:
        yield sdk


def post(fake: RunningFake, body: Any, path: str = "/responses", **headers: str) -> httpx2.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    h = {"authorization": f"Bearer {KEY}", "content-type": "application/json", **headers}
    return httpx2.post(fake.url + path, content=content, headers=h, timeout=10)


def user(text: str = "hi") -> dict[str, Any]:
    return {"role": "user", "content": text}


def reasoning(text: str | None = "thinking") -> dict[str, Any]:
    item: dict[str, Any] = {"type": "reasoning", "id": "rs_1", "summary": []}
    if text is not None:
        item["content"] = [{"type": "reasoning_text", "text": text}]
    return item


def call(call_id: str = "call_1") -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "shell", "arguments": "{}"}


def output(call_id: str = "call_1") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "ok"}


def refusal(fake: RunningFake, body: Any) -> str:
    resp = post(fake, body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ENVELOPE
    message: str = error["message"]
    return message


# --- answers ------------------------------------------------------------------------------------------------


def test_a_text_answer_with_reasoning_and_usage(client: openai.OpenAI, fake: RunningFake) -> None:
    answer = client.responses.create(model="deepseek-flash", input="Hello")
    assert answer.output_text == "Answer 1: the fake DeepSeek says hello."
    assert [o.type for o in answer.output] == ["reasoning", "message"]
    assert answer.id.startswith("resp_") and answer.status == "completed" and answer.store is False
    assert answer.output[0].content[0].text == "The user sent 1 items; I will answer."  # type: ignore[union-attr,index]
    usage = answer.usage
    assert usage is not None and usage.output_tokens_details.reasoning_tokens == 8
    assert usage.input_tokens == len(fake.state.requests[-1].body) // 4 + 1
    assert usage.input_tokens_details.cached_tokens == usage.input_tokens // 3
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_effort_none_turns_thinking_off(client: openai.OpenAI) -> None:
    answer = client.responses.create(model="deepseek-v4-pro", input="Hello", reasoning={"effort": "none"})
    assert [o.type for o in answer.output] == ["message"]
    assert answer.usage is not None and answer.usage.output_tokens_details.reasoning_tokens == 0


def test_a_function_call_after_reasoning_then_the_tool_said(client: openai.OpenAI) -> None:
    history: list[Any] = [user("run it")]
    first = client.responses.create(model="deepseek-flash", input=history, tools=[SHELL])  # type: ignore[list-item]
    assert [o.type for o in first.output] == ["reasoning", "function_call"]
    fc = first.output[1]
    assert fc.type == "function_call" and fc.name == "shell" and fc.arguments == '{"q": "x"}'
    assert fc.call_id.startswith("call_00_")
    history += [*first.output, {"type": "function_call_output", "call_id": fc.call_id, "output": "4C"}]
    second = client.responses.create(model="deepseek-flash", input=history, tools=[SHELL])  # type: ignore[list-item]
    assert second.output_text == "Answer 4: the tool said 4C"


def test_dropping_the_reasoning_item_is_refused(client: openai.OpenAI) -> None:
    first = client.responses.create(model="deepseek-flash", input=[user()], tools=[SHELL])  # type: ignore[list-item]
    history = [user(), first.output[1], {"type": "function_call_output", "call_id": first.output[1].call_id,  # type: ignore[union-attr]
                                         "output": "x"}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="deepseek-flash", input=history, tools=[SHELL])  # type: ignore[arg-type]
    assert caught.value.body["message"] == REASONING_MISSING  # type: ignore[index]


def test_include_adds_deepseeks_encrypted_handle(fake: RunningFake) -> None:
    body = {"model": "deepseek-flash", "input": "x", "include": ["reasoning.encrypted_content"]}
    handle = post(fake, body).json()["output"][0]["encrypted_content"]
    assert handle.endswith("-0") and len(handle) == 38
    assert "encrypted_content" not in post(fake, {**body, "include": []}).json()["output"][0]


def test_max_output_tokens_cuts_the_answer(fake: RunningFake) -> None:
    answer = post(fake, {"model": "deepseek-flash", "input": "x", "max_output_tokens": 10}).json()
    assert answer["status"] == "incomplete"
    assert answer["incomplete_details"] == {"reason": "max_output_tokens"}
    assert answer["usage"]["output_tokens"] == 10


def test_a_forced_function_and_json_output(fake: RunningFake) -> None:
    tools = [SHELL, {**SHELL, "name": "grep"}]
    body = {"model": "deepseek-flash", "input": [user()], "tools": tools,
            "tool_choice": {"type": "function", "name": "grep"}}
    assert post(fake, body).json()["output"][-1]["name"] == "grep"
    fmt = {"model": "deepseek-flash", "input": "x", "text": {"format": {"type": "json_object"}}}
    assert json.loads(post(fake, fmt).json()["output"][-1]["content"][0]["text"])["ok"] is True


# --- the stream ---------------------------------------------------------------------------------------------


def test_the_stream_has_named_events_sequence_numbers_and_no_done(fake: RunningFake) -> None:
    resp = post(fake, {"model": "deepseek-flash", "input": [user()], "tools": [SHELL], "stream": True})
    assert resp.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in resp.content.split(b"\n\n") if b and not b.startswith(b":")]
    events = [(b.split(b"\n")[0][7:].decode(), json.loads(b.split(b"\n")[1][6:])) for b in blocks]
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    names = [name for name, _ in events]
    assert names[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert "response.reasoning_text.delta" in names and "response.function_call_arguments.done" in names
    assert names[-1] == "response.completed" and b"[DONE]" not in resp.content
    sent_tokens = fake.state.requests[-1].completion_tokens_sent
    assert events[-1][1]["response"]["usage"]["output_tokens"] == sent_tokens


def test_the_sdk_streams_and_accumulates(client: openai.OpenAI) -> None:
    with client.responses.stream(model="deepseek-flash", input="Hello") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.output_text.delta" in kinds and kinds[-1] == "response.completed"
    assert final.output_text == "Answer 1: the fake DeepSeek says hello."


def test_an_incomplete_stream_ends_with_response_incomplete(fake: RunningFake) -> None:
    resp = post(fake, {"model": "deepseek-flash", "input": "x", "stream": True, "max_output_tokens": 3})
    assert resp.content.rstrip().split(b"\n\n")[-1].startswith(b"event: response.incomplete")


def test_a_stream_without_its_terminal_event_issues_no_usage(fake: RunningFake) -> None:
    body = {"model": "deepseek-flash", "input": "x", "stream": True}
    resp = post(fake, body, **{"x-fake-terminal": "none"})
    assert b"response.completed" not in resp.content and b"response.output_item.done" in resp.content
    fake.state.wait_idle(5)
    assert fake.state.requests[-1].usage_sent is False and fake.state.issued_usage == {}


# --- usage totals and faults --------------------------------------------------------------------------------


def test_issued_usage_per_key_counts_both_namings(client: openai.OpenAI, fake: RunningFake) -> None:
    client.responses.create(model="deepseek-flash", input="one")
    with client.responses.stream(model="deepseek-flash", input="two") as stream:
        stream.get_final_response()
    fake.state.wait_idle(5)
    totals = fake.state.issued_usage[KEY]
    usages = [r.usage for r in fake.state.requests]
    assert totals["requests"] == totals["responses_requests"] == 2
    assert totals["input_tokens"] == totals["prompt_tokens"] == sum(u["input_tokens"] for u in usages)  # type: ignore[index]
    assert totals["cached_tokens"] == totals["prompt_cache_hit_tokens"]
    assert totals["prompt_cache_miss_tokens"] == totals["input_tokens"] - totals["cached_tokens"]
    assert totals["output_tokens"] == totals["completion_tokens"] and totals["reasoning_tokens"] == 16


@pytest.mark.parametrize(("fault", "status"), [("http_500", 500), ("http_429", 429), ("http_402", 402)])
def test_error_faults(fake: RunningFake, fault: str, status: int) -> None:
    resp = post(fake, {"model": "deepseek-flash", "input": "x"}, **{"x-fake-fault": fault})
    assert resp.status_code == status


def test_error_mid_stream_ends_with_response_failed(fake: RunningFake) -> None:
    resp = post(fake, {"model": "deepseek-flash", "input": "x", "stream": True},
                **{"x-fake-fault": "error_mid_stream"})
    last = resp.content.rstrip().split(b"\n\n")[-1]
    assert last.startswith(b"event: response.failed")
    assert json.loads(last.split(b"data: ", 1)[1])["response"]["status"] == "failed"
    fake.state.wait_idle(5)
    assert fake.state.requests[-1].outcome == "stream_error"


def test_auth_methods_and_paths(fake: RunningFake) -> None:
    body = {"model": "deepseek-flash", "input": "x"}
    assert post(fake, body, path="/v1/responses").status_code == 200
    assert httpx2.post(fake.url + "/responses", json=body).status_code == 401
    assert post(fake, body, authorization="Bearer sk-bad-key").status_code == 401
    assert httpx2.get(fake.url + "/responses", headers={"authorization": f"Bearer {KEY}"}).status_code == 405
    assert post(fake, body, path="/responses/compact").status_code == 404, "DeepSeek serves no compaction"


def test_validation_off_accepts_any_object(fake: RunningFake) -> None:
    fake.state.configure(validate=False)
    assert post(fake, {"input": [output("nowhere")]}).status_code == 200


# --- DeepSeek's 400s ----------------------------------------------------------------------------------------


def test_the_observed_texts(fake: RunningFake) -> None:
    tools = {"tools": [SHELL]}
    assert refusal(fake, {"model": "deepseek-flash", "input": [user(), {"type": "function_call_output",
                                                                        "id": "hb", "output": "x"}]}) \
        .startswith(f"{DESERIALIZE} input[1]: missing field `call_id`")
    assert refusal(fake, {"model": "deepseek-flash", "input": [user(), output("call_zz")]}) == (
        "No tool call found for tool output with call_id call_zz")
    dev = {"role": "developer", "content": "hook"}
    assert refusal(fake, {"model": "deepseek-flash", "input": [user(), reasoning(), call(), dev, output()],
                          **tools}) == "No tool output found for tool call call_1"
    assert refusal(fake, {"model": "deepseek-flash", "input": [user(), reasoning(), call(), reasoning(),
                                                                output()], **tools}) == (
        "No tool output found for tool call call_1")
    assert refusal(fake, {"model": "deepseek-flash", "input": [user(), reasoning(), call()], **tools}) == (
        "No tool output found for tool call call_1")
    for bad in (None, ""):
        assert refusal(fake, {"model": "deepseek-flash", "input": [user(), reasoning(bad), call(), output()],
                              **tools}) == REASONING_MISSING
    summary_only = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "x"}]}
    assert refusal(fake, {"model": "deepseek-flash", "input": [user(), summary_only, call(), output()],
                          **tools}) == REASONING_MISSING
    assert refusal(fake, {"model": "deepseek-v4.1-flash", "input": "x"}) == (
        "The supported API model names are deepseek-flash, deepseek-v4-pro, but you passed "
        "deepseek-v4.1-flash.")


def test_what_deepseek_accepts(fake: RunningFake) -> None:
    accepted = [
        {"model": "deepseek-flash", "input": [user(), call(), output()]},  # no tools: reasoning not needed
        {"model": "deepseek-flash", "input": [user(), call(), output()], "tools": [SHELL],
         "reasoning": {"effort": "none"}},
        {"model": "deepseek-flash", "input": [user(), reasoning(), call("a"), call("b"), output("b"),
                                              output("a")], "tools": [SHELL]},
        {"model": "deepseek-flash", "tools": [SHELL],
         "input": [user(), reasoning(), call(), {"type": "agent_message"}, output()]},
        {"model": "deepseek-v4-flash", "input": "x", "previous_response_id": "resp_1", "store": True,
         "truncation": "auto", "unknown": {"x": 1}, "temperature": 5},
        {"model": "deepseek-v4-pro", "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://x/y.png"}]}]},
    ]
    for body in accepted:
        assert responses_error(body) is None, body
        assert post(fake, body).status_code == 200


@pytest.mark.parametrize("body", [
    {"model": "deepseek-flash", "input": "x", "tools": [{"type": "custom", "name": "grep"}]},
    {"model": "deepseek-flash", "input": "x", "tools": [{"type": "function", "name": "a.b"}]},
    {"model": "deepseek-flash", "input": "x", "tools": [SHELL, SHELL]},
    {"model": "deepseek-flash", "input": "x", "tool_choice": {"type": "web_search"}},
    {"model": "deepseek-flash", "input": [{"role": "system", "content": [{"type": "input_image",
                                                                          "image_url": "https://x"}]}]},
    {"model": "deepseek-flash", "input": "x", "user": "用" * 171},  # 513 bytes; "a@b.c" is fine since 2026-11
    {"model": "deepseek-flash", "input": "x", "safety_check": {"level": "medium"}},
    {"model": "deepseek-flash", "input": "x", "max_output_tokens": 393_217},
    {"model": "deepseek-flash", "input": "x", "top_logprobs": 21},
    {"model": "deepseek-flash", "input": "x", "temperature": 3, "reasoning": {"effort": "none"}},
    {"model": "deepseek-flash", "input": [{"role": "tool", "content": "x"}]},
    {"model": "deepseek-flash", "input": [call(""), output("")]},
    {"model": "deepseek-flash", "input": [call(), output(), call(), output()]},
    {"model": "deepseek-flash", "input": 5},
    {"input": "x"},
    [1],
], ids=["custom-tool", "function-name", "duplicate-name", "web-search-forced", "system-image", "user",
        "safety-check", "max-output", "top-logprobs", "temperature", "role", "empty-call-id",
        "duplicate-call-id", "input-type",
        "no-model", "not-an-object"])
def test_what_deepseek_refuses(fake: RunningFake, body: Any) -> None:
    assert refusal(fake, body)
    assert fake.state.requests[-1].refused is not None


def test_a_tool_loop_of_several_rounds_then_text(fake: RunningFake) -> None:
    """`tool_rounds`: a call after the user's message and after the outputs of fewer rounds than that, then
    text; `tool_name` picks among the request's functions, `tool_arguments` are the call's arguments."""
    fake.state.configure(tool_rounds=2, tool_name="read", tool_arguments='{"path": "README.md"}')
    read = {**SHELL, "name": "read"}
    items: list[dict[str, Any]] = [{"type": "message", **user()}]
    kinds = []
    for _ in range(4):
        answer = post(fake, {"model": "deepseek-flash", "input": items, "tools": [SHELL, read]}).json()
        out = answer["output"]
        kinds.append([i["type"] for i in out])
        items += out
        calls = [i for i in out if i["type"] == "function_call"]
        if not calls:
            break
        assert (calls[0]["name"], json.loads(calls[0]["arguments"])) == ("read", {"path": "README.md"})
        items.append({"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "42"})
    assert kinds == [["reasoning", "function_call"]] * 2 + [["reasoning", "message"]]
    fake.state.configure(tool_name="absent")
    answer = post(fake, {"model": "deepseek-flash", "input": [{"type": "message", **user()}],
                         "tools": [SHELL, read]}).json()
    assert answer["output"][-1]["name"] == "shell", "a tool the request lacks: the first one"
