"""Tests of the fake DeepSeek itself, over real loopback HTTP, with httpx2 and the openai SDK."""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam, ChatCompletionToolParam

from chatgate.demo.deepseek import FakeState
from chatgate.demo.rules import deepseek_error
from tests.fakes.server import RunningFake, run_fake_deepseek, spawn_fake_deepseek

KEY = "sk-test-0001"
AUTH = {"Authorization": f"Bearer {KEY}"}
USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
TOOLS: list[ChatCompletionToolParam] = [
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
]


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


@pytest.fixture
def http(fake: RunningFake) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=fake.url, headers=AUTH, timeout=10) as raw:
        yield raw


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "deepseek-flash", "messages": USER, **extra}


def sse_payloads(text: str) -> list[Any]:
    events = [event for event in text.split("\n\n") if event.startswith("data: ")]
    return [event[6:] if event == "data: [DONE]" else orjson.loads(event[6:]) for event in events]


# ------------------------------------------------------------------------------------------ answers


def test_nonstreaming_text_with_reasoning_and_usage(client: openai.OpenAI, fake: RunningFake) -> None:
    result = client.chat.completions.create(model="deepseek-flash", messages=USER)
    choice = result.choices[0]
    assert result.object == "chat.completion"
    assert result.system_fingerprint
    assert choice.finish_reason == "stop"
    assert choice.message.content == "Answer 1: the fake DeepSeek says hello."
    assert getattr(choice.message, "reasoning_content", "")
    usage = result.model_dump()["usage"]
    assert usage["prompt_tokens"] == usage["prompt_cache_hit_tokens"] + usage["prompt_cache_miss_tokens"]
    assert usage["prompt_cache_hit_tokens"] > 0 and usage["prompt_cache_miss_tokens"] > 0
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_cache_hit_tokens"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert fake.state.issued_usage[KEY]["total_tokens"] == usage["total_tokens"]


def test_same_request_gives_same_usage(http: httpx2.Client) -> None:
    first, second = (http.post("/chat/completions", json=chat()).json() for _ in range(2))
    assert first["usage"] == second["usage"]
    assert first["choices"] == second["choices"]


def test_thinking_disabled_has_no_reasoning(http: httpx2.Client) -> None:
    body = http.post("/v1/chat/completions", json=chat(thinking={"type": "disabled"})).json()
    assert "reasoning_content" not in body["choices"][0]["message"]
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    legacy = http.post("/chat/completions", json=chat(model="deepseek-chat")).json()
    assert "reasoning_content" not in legacy["choices"][0]["message"]


def test_tool_call_answer(client: openai.OpenAI) -> None:
    result = client.chat.completions.create(model="deepseek-flash", messages=USER, tools=TOOLS)
    choice = result.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content in ("", None)
    (call,) = choice.message.tool_calls or []
    assert call.id.startswith("call_00_") and call.type == "function"
    assert call.function.name == "search"
    assert orjson.loads(call.function.arguments) == {"q": "x"}


def test_tool_result_is_mentioned(http: httpx2.Client) -> None:
    call = {"id": "call_00_a", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    messages = [
        *USER,
        {"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_00_a", "content": "sunny and warm"},
    ]
    body = http.post("/chat/completions", json=chat(messages=messages, tools=TOOLS)).json()
    assert body["choices"][0]["finish_reason"] == "stop"
    assert "sunny and warm" in body["choices"][0]["message"]["content"]


def test_max_tokens_gives_length(http: httpx2.Client) -> None:
    body = http.post("/chat/completions", json=chat(max_tokens=2, thinking={"type": "disabled"})).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 2


def test_models(client: openai.OpenAI) -> None:
    ids = [model.id for model in client.models.list()]
    assert ids == ["deepseek-flash", "deepseek-v4-pro"]


def test_bad_body_gets_deepseek_400(http: httpx2.Client) -> None:
    missing = http.post("/chat/completions", json={"model": "deepseek-flash"})
    assert missing.status_code == 400
    assert "missing field `messages`" in missing.json()["error"]["message"]
    options = http.post("/chat/completions", json=chat(stream_options={"include_usage": True}))
    assert options.json()["error"]["message"] == "stream_options should be set along with stream = true"


# ------------------------------------------------------------------------------------------ validation

DESERIALIZE = "Failed to deserialize the JSON body into the target type: "
UNANSWERED = (
    "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
    "'tool_call_id'. (insufficient tool messages following tool_calls message)"
)
ORPHAN_TOOL = "Messages with role 'tool' must be a response to a preceding message with 'tool_calls'"
PASS_BACK = "The `reasoning_content` in the thinking mode must be passed back to the API."
MAX_RANGE = "Invalid max_tokens value, the valid range of max_tokens is [1, 393216]"
EFFORT_CONFLICT = "thinking options type cannot be disabled when reasoning_effort is set"
THINKING_CHOICE = "Thinking mode does not support this tool_choice"


def call(call_id: str = "call_00_a", arguments: Any = "{}", **function: Any) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "search", "arguments": arguments, **function},
    }


def turn(*calls: dict[str, Any], reasoning: str | None = "r") -> dict[str, Any]:
    """An assistant tool-call turn, with reasoning_content unless it is None."""
    message = {"role": "assistant", "content": "", "tool_calls": list(calls)}
    return message if reasoning is None else {**message, "reasoning_content": reasoning}


def answer(call_id: str = "call_00_a") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "sunny"}


def history(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A body: USER, then the given messages, then a new user turn."""
    return chat(messages=[*USER, *messages, {"role": "user", "content": "thanks"}], **extra)


def schema(**extra: Any) -> dict[str, Any]:
    """A function schema that is strict unless `extra` changes it."""
    where = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {"q": {"type": "string"}, "where": where},
        "required": ["q", "where"],
        "additionalProperties": False,
        **extra,
    }


def strict_tools(parameters: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "search", "strict": True, "parameters": parameters}}]


LOOSE = schema(required=["q"])  # "where" is not required
NESTED_OPEN = schema(properties={"where": {"type": "object", "properties": {}}}, required=["where"])
LIMITED = schema(properties={"q": {"type": "string", "maxLength": 5}}, required=["q"])

REFUSED: dict[str, tuple[str, dict[str, Any], str]] = {
    # name: (path, body, DeepSeek's message: exact, or a regex when it starts with "^")
    "R5 developer role": (
        "/chat/completions",
        chat(messages=[*USER, {"role": "developer", "content": "x"}]),
        "^"
        + re.escape(
            DESERIALIZE + "messages[1].role: unknown variant `developer`, expected "
            "one of `system`, `user`, `assistant`, `tool`, `latest_reminder`"
        )
        + r" at line 1 column \d+$",
    ),
    "R5 function role": (
        "/chat/completions",
        chat(messages=[{"role": "function", "content": "x"}]),
        "^" + re.escape(DESERIALIZE + "messages[0].role: unknown variant `function`"),
    ),
    "R11 arguments object": (
        "/chat/completions",
        history(turn(call(arguments={"q": "x"})), answer()),
        "^"
        + re.escape(
            DESERIALIZE + "messages[1].tool_calls[0].function.arguments: "
            "invalid type: map, expected a string at line 1 column "
        ),
    ),
    "R11 no id": (
        "/chat/completions",
        history(turn({"type": "function", "function": {"name": "s"}})),
        "^" + re.escape(DESERIALIZE + "messages[1].tool_calls[0]: missing field `id`"),
    ),
    "R11 no name": (
        "/chat/completions",
        history(turn({"id": "c", "function": {"arguments": "{}"}})),
        "^" + re.escape(DESERIALIZE + "messages[1].tool_calls[0].function: missing field `name`"),
    ),
    "R13 no tool_call_id": (
        "/chat/completions",
        history(turn(call()), {"role": "tool", "content": "x"}),
        "^" + re.escape(DESERIALIZE + "messages[2]: missing field `tool_call_id`"),
    ),
    "R14 tool after user": ("/chat/completions", chat(messages=[*USER, answer()]), ORPHAN_TOOL),
    "R14 tool after text answer": (
        "/chat/completions",
        history({"role": "assistant", "content": "hi"}, answer()),
        ORPHAN_TOOL,
    ),
    "R16 user in between": (
        "/chat/completions",
        history(turn(call()), {"role": "user", "content": "go"}, answer()),
        UNANSWERED,
    ),
    "R16 system in between": (
        "/chat/completions",
        history(turn(call()), {"role": "system", "content": "s"}, answer()),
        UNANSWERED,
    ),
    "R16 one of two answered": (
        "/chat/completions",
        history(turn(call("a"), call("b")), answer("a")),
        UNANSWERED,
    ),
    "R15 unknown id": ("/chat/completions", history(turn(call("a")), answer("zzz")), UNANSWERED),
    "R16 unanswered at the end": ("/chat/completions", chat(messages=[*USER, turn(call())]), UNANSWERED),
    "R17 no reasoning_content": (
        "/chat/completions",
        history(turn(call(), reasoning=None), answer()),
        PASS_BACK,
    ),
    "R17 null reasoning_content": (
        "/v1/chat/completions",
        history(
            {**turn(call()), "reasoning_content": None},
            answer(),
            model="deepseek-v4-pro",
            thinking={"type": "enabled"},
        ),
        PASS_BACK,
    ),
    "R27 zero": ("/chat/completions", chat(max_tokens=0), MAX_RANGE),
    "R27 above 384K": ("/chat/completions", chat(max_tokens=393217), MAX_RANGE),
    "R27 legacy name": ("/chat/completions", chat(model="deepseek-chat", max_tokens=400000), MAX_RANGE),
    "R27 string": (
        "/chat/completions",
        chat(max_tokens="5"),
        "^" + re.escape(DESERIALIZE + 'max_tokens: invalid type: string "5", expected u32'),
    ),
    "R29 options without stream": (
        "/chat/completions",
        chat(stream_options={"include_usage": True}),
        "stream_options should be set along with stream = true",
    ),
    "R32 beta: not all required": (
        "/beta/chat/completions",
        chat(tools=strict_tools(LOOSE)),
        "^Invalid schema for function 'tools\\[0\\].function.parameters': all "
        "properties must be required \\(missing: where\\)",
    ),
    "R32 beta: nested object open": (
        "/beta/chat/completions",
        chat(tools=strict_tools(NESTED_OPEN)),
        "^Invalid schema .*parameters.properties.where': 'additionalProperties' must be false",
    ),
    "R32 beta: maxLength": (
        "/beta/chat/completions",
        chat(tools=strict_tools(LIMITED)),
        "^Invalid schema .*parameters.properties.q': 'maxLength' is not supported",
    ),
    "R32 beta: strict and not strict": (
        "/beta/chat/completions",
        chat(tools=[*strict_tools(schema()), *TOOLS]),
        "^Invalid tools: in strict mode every function",
    ),
    "R34 required": ("/chat/completions", chat(tools=TOOLS, tool_choice="required"), THINKING_CHOICE),
    "R34 named": (
        "/chat/completions",
        chat(
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "search"}},
            thinking={"type": "adaptive"},
        ),
        THINKING_CHOICE,
    ),
    "R36 thinking auto": (
        "/chat/completions",
        chat(thinking={"type": "auto"}),
        "^"
        + re.escape(
            DESERIALIZE + "thinking.type: unknown variant `auto`, expected one of "
            "`adaptive`, `enabled`, `disabled` at line 1 column "
        ),
    ),
    "R41 disabled with effort": (
        "/chat/completions",
        chat(thinking={"type": "disabled"}, reasoning_effort="high"),
        EFFORT_CONFLICT,
    ),
    "R10 empty assistant": (
        "/chat/completions",
        history({"role": "assistant", "content": None}),
        "Invalid assistant message: content or tool_calls must be set",
    ),
    "R6 system array": (
        "/chat/completions",
        chat(messages=[{"role": "system", "content": [{"type": "text", "text": "s"}]}, *USER]),
        "^" + re.escape(DESERIALIZE + "messages[0].content: invalid type: sequence, expected a string"),
    ),
    "R23 json_schema": (
        "/chat/completions",
        chat(response_format={"type": "json_schema"}),
        "This response_format type is unavailable now",
    ),
    "R31 tool name": (
        "/chat/completions",
        chat(tools=[{"type": "function", "function": {"name": "fs.read"}}]),
        "Invalid 'tools[0].function.name': string does not match pattern. Expected a string "
        "that matches the pattern '^[a-zA-Z0-9_-]+$'.",
    ),
    "R33 tool_choice any": (
        "/chat/completions",
        chat(tools=TOOLS, tool_choice="any"),
        "^"
        + re.escape(
            DESERIALIZE + "tool_choice: expected one of `none`, `auto`, "
            "`required` or a tool at line 1 column "
        ),
    ),
}

ACCEPTED: dict[str, tuple[str, dict[str, Any]]] = {
    "R5 every role": (
        "/chat/completions",
        chat(
            messages=[
                {"role": "system", "content": "s"},
                *USER,
                {"role": "assistant", "content": "a"},
                {"role": "latest_reminder", "content": "r"},
                *USER,
            ]
        ),
    ),
    "R11-R16 answered calls": (
        "/chat/completions",
        history(turn(call("a"), call("b")), answer("b"), answer("a")),
    ),
    "R15 extra answer after all answered": (
        "/chat/completions",
        history(turn(call("a")), answer("a"), answer("a")),
    ),
    "R11 type null or absent": (
        "/chat/completions",
        history(
            turn({**call("a"), "type": None}, {"id": "b", "function": {"name": "s", "arguments": ""}}),
            answer("a"),
            answer("b"),
        ),
    ),
    "R17 empty reasoning_content": ("/chat/completions", history(turn(call(), reasoning=""), answer())),
    "R17 deepseek-chat": (
        "/chat/completions",
        history(turn(call(), reasoning=None), answer(), model="deepseek-chat"),
    ),
    "R17 thinking disabled": (
        "/chat/completions",
        history(turn(call(), reasoning=None), answer(), thinking={"type": "disabled"}),
    ),
    "R17 effort none": (
        "/chat/completions",
        history(turn(call(), reasoning=None), answer(), reasoning_effort="none"),
    ),
    "R27 bounds": ("/chat/completions", chat(max_tokens=393216)),
    "R27 one": ("/chat/completions", chat(max_tokens=1, model="deepseek-v4-pro")),
    "R27 null": ("/chat/completions", chat(max_tokens=None)),
    "R29 options with stream": (
        "/chat/completions",
        chat(stream=True, stream_options={"include_usage": True}),
    ),
    "R32 strict off beta": ("/chat/completions", chat(tools=strict_tools(LOOSE))),
    "R32 strict off beta, v1": ("/v1/chat/completions", chat(tools=[*strict_tools(NESTED_OPEN), *TOOLS])),
    "R32 beta: strict schema": ("/beta/chat/completions", chat(tools=strict_tools(schema()))),
    "R32 beta: no strict": ("/beta/chat/completions", chat(tools=TOOLS)),
    "R34 disabled + required": (
        "/chat/completions",
        chat(tools=TOOLS, tool_choice="required", thinking={"type": "disabled"}),
    ),
    "R34 effort none + named": (
        "/chat/completions",
        chat(
            tools=TOOLS,
            reasoning_effort="none",
            tool_choice={"type": "function", "function": {"name": "search"}},
        ),
    ),
    "R34 thinking + auto": ("/chat/completions", chat(tools=TOOLS, tool_choice="auto")),
    "R36 adaptive": ("/chat/completions", chat(thinking={"type": "adaptive"})),
    "R36 enabled + effort": ("/chat/completions", chat(thinking={"type": "enabled"}, reasoning_effort="max")),
    "R41 disabled + effort none": (
        "/chat/completions",
        chat(thinking={"type": "disabled"}, reasoning_effort="none"),
    ),
    "R39 unknown fields": ("/chat/completions", chat(temp=0.1, dsh_trace={"x": [1]}, user="u")),
    "R10 empty string content": ("/chat/completions", history({"role": "assistant", "content": ""})),
    "tool content array": (
        "/chat/completions",
        history(
            turn(call()),
            {"role": "tool", "tool_call_id": "call_00_a", "content": [{"type": "text", "text": "sunny"}]},
        ),
    ),
}


@pytest.mark.parametrize(("path", "body", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_refuses_what_deepseek_refuses(
    http: httpx2.Client, fake: RunningFake, path: str, body: dict[str, Any], message: str
) -> None:
    response = http.post(path, json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        None,
        "invalid_request_error",
    )
    if message.startswith("^"):
        assert re.match(message, error["message"]), error["message"]
    else:
        assert error["message"] == message
    (rec,) = fake.state.requests
    assert rec.refused == error["message"] and rec.outcome == "error_response" and rec.usage is None


@pytest.mark.parametrize(("path", "body"), ACCEPTED.values(), ids=ACCEPTED.keys())
def test_accepts_what_deepseek_accepts(http: httpx2.Client, path: str, body: dict[str, Any]) -> None:
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    if body.get("stream"):
        assert response.text.endswith("data: [DONE]\n\n")
    else:
        assert response.json()["choices"][0]["message"]["role"] == "assistant"


def test_effort_none_turns_thinking_off(http: httpx2.Client) -> None:
    message = http.post("/chat/completions", json=chat(reasoning_effort="none")).json()["choices"][0][
        "message"
    ]
    assert "reasoning_content" not in message


def test_validation_can_be_switched_off(http: httpx2.Client, fake: RunningFake) -> None:
    odd = chat(messages=[{"role": "developer", "content": "x"}], thinking={"type": "auto"}, max_tokens=0)
    assert http.post("/chat/completions", json=odd).status_code == 400
    assert http.post("/_fake/config", json={"validate": "no"}).status_code == 400
    assert http.post("/_fake/config", json={"validate": False}).json()["validate"] is False
    accepted = http.post("/chat/completions", json=odd)
    assert accepted.status_code == 200 and accepted.json()["choices"][0]["finish_reason"] == "length"
    assert http.post("/chat/completions", content=b"[1]").status_code == 400  # still a JSON object only
    http.post("/_fake/reset")
    assert http.get("/_fake/config").json()["validate"] is True


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
BASES = [body for _, body in ACCEPTED.values()] + [body for _, body, _ in REFUSED.values()]


@pytest.mark.slow  # a property test over hundreds of examples
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    base=st.sampled_from(BASES),
    key=st.sampled_from(
        ["messages", "tools", "thinking", "tool_choice", "max_tokens", "stream_options", "model", "x"]
    ),
    value=json_values,
    index=st.integers(0, 3),
    beta=st.booleans(),
)
def test_rules_never_raise(base: dict[str, Any], key: str, value: Any, index: int, beta: bool) -> None:
    """Any JSON in any field, also inside a message or a tool: a message or None, never an exception."""
    body = orjson.loads(orjson.dumps(base))
    for name in ("messages", "tools"):
        if key == name and isinstance(body.get(name), list) and index < len(body[name]):
            item = body[name][index]
            if isinstance(item, dict) and isinstance(value, dict):
                value = {**item, **value}
            body[name][index] = value
            break
    else:
        body[key] = value
    problem = deepseek_error("/beta/chat/completions" if beta else "/chat/completions", body, 100)
    assert problem is None or isinstance(problem, str)


# ------------------------------------------------------------------------------------------ auth


def test_missing_and_bad_keys(fake: RunningFake) -> None:
    missing = httpx2.post(f"{fake.url}/chat/completions", json=chat())
    assert missing.status_code == 401
    assert missing.json()["error"]["type"] == "authentication_error"
    bad = openai.OpenAI(base_url=fake.url, api_key="sk-bad-abcd", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        bad.chat.completions.create(model="deepseek-flash", messages=USER)
    assert caught.value.body == {
        "message": "Authentication Fails, Your api key: ****abcd is invalid",
        "type": "authentication_error",
        "param": None,
        "code": "invalid_request_error",
    }


def test_valid_keys_restriction(fake: RunningFake, http: httpx2.Client) -> None:
    fake.state.configure(valid_keys=["sk-other"])
    assert http.post("/chat/completions", json=chat()).status_code == 401


# ------------------------------------------------------------------------------------------ streaming


def test_stream_arrives_chunk_by_chunk(client: openai.OpenAI, fake: RunningFake) -> None:
    fake.state.configure(chunk_delay=0.05)
    stream = client.chat.completions.create(model="deepseek-flash", messages=USER, stream=True)
    arrivals, chunks = [], []
    for chunk in stream:
        arrivals.append(time.monotonic())
        chunks.append(chunk.model_dump())
    content = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert len([piece for piece in content if piece]) >= 3
    assert "".join(piece or "" for piece in content) == "Answer 1: the fake DeepSeek says hello."
    assert arrivals[-1] - arrivals[0] > 0.2  # ~15 chunks, 0.05 s apart: not one burst
    assert len({round(t, 2) for t in arrivals}) > len(arrivals) // 2


def test_stream_wire_format(http: httpx2.Client) -> None:
    text = http.post("/chat/completions", json=chat(stream=True)).text
    assert text.startswith(": keep-alive\n\n")
    assert text.endswith("data: [DONE]\n\n")
    payloads = sse_payloads(text)
    assert payloads[-1] == "[DONE]"
    first, last = payloads[0], payloads[-2]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": None, "reasoning_content": ""}
    assert last["choices"][0]["delta"] == {"content": ""}
    assert last["choices"][0]["finish_reason"] == "stop"
    assert last["usage"]["completion_tokens"] > 0  # usage although include_usage was not asked
    assert all("usage" not in p for p in payloads[:-2])
    assert len({p["id"] for p in payloads[:-1]}) == 1


def test_stream_usage_matches_nonstream(http: httpx2.Client) -> None:
    nonstream = http.post("/chat/completions", json=chat(stream=False)).json()["usage"]
    streamed = sse_payloads(http.post("/chat/completions", json=chat(stream=True)).text)[-2]["usage"]
    assert streamed["completion_tokens"] == nonstream["completion_tokens"]
    assert streamed["prompt_tokens"] in range(nonstream["prompt_tokens"] - 2, nonstream["prompt_tokens"] + 3)


def test_streamed_tool_call_fragments(http: httpx2.Client) -> None:
    payloads = sse_payloads(http.post("/chat/completions", json=chat(stream=True, tools=TOOLS)).text)
    fragments = [
        p["choices"][0]["delta"]["tool_calls"][0]
        for p in payloads[:-1]
        if "tool_calls" in p["choices"][0]["delta"]
    ]
    assert fragments[0]["id"].startswith("call_00_") and fragments[0]["function"]["name"] == "search"
    assert all("id" not in f and "name" not in f["function"] for f in fragments[1:])
    assert len(fragments) >= 3 and {f["index"] for f in fragments} == {0}
    assert orjson.loads("".join(f["function"]["arguments"] for f in fragments)) == {"q": "x"}
    assert payloads[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_separate_usage_chunk_mode(http: httpx2.Client, fake: RunningFake) -> None:
    fake.state.configure(usage_mode="separate_when_asked")
    asked = sse_payloads(
        http.post("/chat/completions", json=chat(stream=True, stream_options={"include_usage": True})).text
    )
    assert asked[-2]["choices"] == [] and asked[-2]["usage"]["total_tokens"] > 0
    assert all(p["usage"] is None for p in asked[:-2])
    assert asked[-3]["choices"][0]["finish_reason"] == "stop"
    silent = sse_payloads(http.post("/chat/completions", json=chat(stream=True)).text)
    assert all("usage" not in p for p in silent[:-1])
    assert fake.state.requests[-1].usage_sent is False


def test_openai_sees_usage_in_both_modes(client: openai.OpenAI, fake: RunningFake) -> None:
    for mode in ("last_chunk", "separate_when_asked"):
        fake.state.configure(usage_mode=mode)
        stream = client.chat.completions.create(
            model="deepseek-flash",
            messages=USER,
            stream=True,
            stream_options={"include_usage": True},
        )
        usages = [chunk.usage for chunk in stream if chunk.usage is not None]
        assert len(usages) == 1 and usages[0].total_tokens > 0


def test_nonstream_keepalive_lines(client: openai.OpenAI, fake: RunningFake, http: httpx2.Client) -> None:
    fake.state.configure(nonstream_keepalive_lines=3)
    assert http.post("/chat/completions", json=chat()).text.startswith("\n\n\n{")
    result = client.chat.completions.create(model="deepseek-flash", messages=USER)
    assert result.choices[0].message.content


def test_client_disconnect_is_recorded(fake: RunningFake) -> None:
    headers = {**AUTH, "x-fake-chunk-delay": "0.05", "x-request-id": "req-cut"}
    with httpx2.stream(
        "POST", f"{fake.url}/chat/completions", headers=headers, json=chat(stream=True)
    ) as response:
        seen = 0
        for line in response.iter_lines():
            seen += line.startswith("data: ")
            if seen == 5:
                break
    assert fake.state.wait_idle(5)
    (entry,) = fake.state.issued_report()["requests"]
    assert entry["request_id"] == "req-cut" and entry["outcome"] == "client_disconnected"
    assert entry["cut_short"] and not entry["usage_sent"]
    assert 0 < entry["completion_tokens_sent"] < entry["usage"]["completion_tokens"]
    assert KEY not in fake.state.issued_usage


# ------------------------------------------------------------------------------------------ faults

STATUS_FAULTS = [
    ("http_500", openai.InternalServerError, 500),
    ("http_503", openai.InternalServerError, 503),
    ("http_429", openai.RateLimitError, 429),
    ("http_402", openai.APIStatusError, 402),
    ("http_401", openai.AuthenticationError, 401),
    ("http_400", openai.BadRequestError, 400),
    ("http_422", openai.UnprocessableEntityError, 422),
    ("http_502", openai.InternalServerError, 502),
    ("http_504", openai.InternalServerError, 504),
    ("http_403", openai.PermissionDeniedError, 403),
    ("http_404", openai.NotFoundError, 404),
    ("http_413", openai.APIStatusError, 413),
]


@pytest.mark.parametrize(("fault", "error", "status"), STATUS_FAULTS)
def test_status_faults(
    client: openai.OpenAI, fault: str, error: type[openai.APIStatusError], status: int
) -> None:
    with pytest.raises(error) as caught:
        client.chat.completions.create(
            model="deepseek-flash",
            messages=USER,
            extra_headers={"x-fake-fault": fault},
        )
    assert caught.value.status_code == status
    assert type(caught.value) is error or status in (402, 413)


def test_error_bodies_are_deepseeks(http: httpx2.Client, fake: RunningFake) -> None:
    balance = http.post("/chat/completions", json=chat(), headers={"x-fake-fault": "http_402"})
    assert balance.headers["content-type"] == "application/json"
    assert balance.json() == {
        "error": {
            "message": "Insufficient Balance",
            "type": "unknown_error",
            "param": None,
            "code": "invalid_request_error",
        }
    }
    limited = http.post("/chat/completions", json=chat(), headers={"x-fake-fault": "http_429"})
    assert "exceeds your concurrency limit" in limited.json()["error"]["message"]
    fake.state.configure(error_content_type="application/octet-stream")
    risky = http.post("/chat/completions", json=chat(), headers={"x-fake-fault": "http_400"})
    assert risky.headers["content-type"] == "application/octet-stream"
    assert orjson.loads(risky.content)["error"]["message"] == "Content Exists Risk"


def test_global_fault_with_count(http: httpx2.Client, fake: RunningFake) -> None:
    fake.state.configure(fault="http_500", fault_count=1)
    assert http.post("/chat/completions", json=chat()).status_code == 500
    assert http.post("/chat/completions", json=chat()).status_code == 200
    assert (
        http.post("/chat/completions", json=chat(), headers={"x-fake-fault": "http_503"}).status_code == 503
    )


def test_reset_mid_stream_raises(client: openai.OpenAI, fake: RunningFake) -> None:
    stream = client.chat.completions.create(
        model="deepseek-flash",
        messages=USER,
        stream=True,
        extra_headers={"x-fake-fault": "reset_mid_stream"},
    )
    received: list[ChatCompletionChunk] = []
    with pytest.raises((httpx2.TransportError, openai.APIError)):
        received.extend(stream)
    assert len(received) == 3
    assert fake.state.wait_idle(5)
    rec = fake.state.requests[-1]
    assert rec.outcome == "reset" and rec.completion_tokens_sent == 2 and not rec.usage_sent


def test_reset_mid_nonstream_body(http: httpx2.Client) -> None:
    with pytest.raises(httpx2.TransportError):
        http.post("/chat/completions", json=chat(), headers={"x-fake-fault": "reset_mid_stream"})


def test_error_mid_stream_raises_api_error(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="deepseek-flash",
        messages=USER,
        stream=True,
        extra_headers={"x-fake-fault": "error_mid_stream"},
    )
    with pytest.raises(openai.APIError):
        list(stream)


def test_stall_mid_stream_times_out(fake: RunningFake) -> None:
    headers = {**AUTH, "x-fake-fault": "stall_mid_stream"}
    timeout = httpx2.Timeout(5, read=0.3)
    with (
        pytest.raises(httpx2.ReadTimeout),
        httpx2.stream(
            "POST", f"{fake.url}/chat/completions", headers=headers, json=chat(stream=True), timeout=timeout
        ) as response,
    ):
        for _ in response.iter_raw():
            pass
    assert fake.state.wait_idle(5)
    rec = fake.state.requests[-1]
    assert rec.outcome == "client_disconnected" and rec.completion_tokens_sent == 2


def test_short_stall_resumes(http: httpx2.Client) -> None:
    headers = {"x-fake-fault": "stall_mid_stream", "x-fake-delay": "0.1"}
    text = http.post("/chat/completions", json=chat(stream=True), headers=headers).text
    assert text.endswith("data: [DONE]\n\n")


def test_no_headers_times_out(fake: RunningFake) -> None:
    with pytest.raises(httpx2.ReadTimeout):
        httpx2.post(
            f"{fake.url}/chat/completions",
            headers={**AUTH, "x-fake-fault": "no_headers"},
            json=chat(),
            timeout=httpx2.Timeout(5, read=0.3),
        )
    assert fake.state.wait_idle(5)
    assert fake.state.requests[-1].outcome == "client_disconnected"


def test_slow_then_normal(http: httpx2.Client) -> None:
    response = http.post(
        "/chat/completions", json=chat(), headers={"x-fake-fault": "slow", "x-fake-delay": "0.2"}
    )
    assert response.status_code == 200 and response.json()["choices"]


def test_non_json_200(http: httpx2.Client) -> None:
    response = http.post("/chat/completions", json=chat(), headers={"x-fake-fault": "non_json_200"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(response.content)


# ------------------------------------------------------------------------------------------ records


def test_sent_is_every_byte_the_client_received(http: httpx2.Client, fake: RunningFake) -> None:
    fake.state.configure(keepalive_count=2, nonstream_keepalive_lines=2, chunk_delay=0.001)
    responses = [
        http.post("/chat/completions", json=chat(stream=True, tools=TOOLS)),
        http.post("/chat/completions", json=chat()),
        http.post("/chat/completions", json=chat(max_tokens=0)),
        http.post("/chat/completions", json=chat(), headers={"x-fake-fault": "http_429"}),
        http.get("/models"),
    ]
    assert [r.status_code for r in responses] == [200, 200, 400, 429, 200]
    assert [bytes(rec.sent) for rec in fake.state.requests] == [r.content for r in responses]
    assert responses[0].content.startswith(b": keep-alive\n\n: keep-alive\n\ndata: {")
    assert responses[1].content.startswith(b"\n\n{")
    entry = http.get("/_fake/requests").json()[0]
    assert base64.b64decode(entry["sent_b64"]) == responses[0].content


def test_sent_stops_where_the_stream_was_cut(fake: RunningFake) -> None:
    headers = {**AUTH, "x-fake-fault": "reset_mid_stream"}
    received = bytearray()
    with (
        pytest.raises(httpx2.TransportError),
        httpx2.stream(
            "POST", f"{fake.url}/chat/completions", headers=headers, json=chat(stream=True)
        ) as response,
    ):
        for piece in response.iter_raw():
            received += piece
    assert fake.state.wait_idle(5)
    assert fake.state.requests[-1].sent == received and received.count(b"data: {") == 3


def test_records_what_reached_it(http: httpx2.Client, fake: RunningFake) -> None:
    body = orjson.dumps(chat(user_id="u1"))
    headers = {"content-type": "application/json", "x-request-id": "req-1", "x-custom": "yes"}
    http.post("/beta/chat/completions", content=body, headers=headers)
    (rec,) = fake.state.requests
    assert (rec.method, rec.path, rec.body, rec.auth_key) == ("POST", "/beta/chat/completions", body, KEY)
    assert rec.headers["x-custom"] == "yes" and rec.request_id == "req-1"
    assert rec.json["user_id"] == "u1"
    assert rec.completed and rec.usage_sent and rec.usage is not None
    assert fake.state.issued_usage[KEY]["prompt_tokens"] == rec.usage["prompt_tokens"]


def test_control_endpoints_in_process(http: httpx2.Client, fake: RunningFake) -> None:
    assert (
        http.post("/_fake/config", json={"chunk_delay": 0.01, "fault": "http_429"}).json()["fault"]
        == "http_429"
    )
    assert http.post("/chat/completions", json=chat()).status_code == 429
    assert http.post("/_fake/config", json={"nope": 1}).status_code == 400
    assert http.post("/_fake/config", json={"fault": "nope"}).status_code == 400
    (entry,) = http.get("/_fake/requests").json()
    assert entry["status"] == 429 and entry["fault"] == "http_429"
    http.post("/_fake/reset")
    assert http.get("/_fake/requests").json() == []
    assert http.get("/_fake/config").json()["fault"] is None


@pytest.mark.slow  # the fake as a process
def test_control_endpoints_in_separate_process() -> None:
    with spawn_fake_deepseek("--keepalive-count", "2") as fake:
        fake.control.config(usage_mode="separate_when_asked")
        sdk = openai.OpenAI(base_url=fake.url, api_key=KEY, max_retries=0, timeout=10)
        result = sdk.chat.completions.create(
            model="deepseek-flash",
            messages=USER,
            extra_headers={"x-request-id": "req-sep"},
        )
        stream = sdk.chat.completions.create(model="deepseek-flash", messages=USER, stream=True)
        assert all(chunk.usage is None for chunk in stream)
        first, second = fake.control.requests(wait_idle=2)
        assert orjson.loads(base64.b64decode(first["body_b64"])) == first["json"]
        assert first["json"]["messages"] == USER and first["headers"]["x-request-id"] == "req-sep"
        issued = fake.control.issued()
        assert result.usage is not None
        assert issued["per_key"][KEY]["total_tokens"] == result.usage.total_tokens
        assert issued["requests"][0]["request_id"] == "req-sep" and issued["requests"][0]["completed"]
        assert second["stream"] and not second["usage_sent"]
        fake.control.reset()
        assert fake.control.requests() == [] and fake.control.config()["keepalive_count"] == 2
        assert fake.control.config()["validate"] is True


@pytest.mark.slow  # the fake as a process
def test_no_validate_flag_in_separate_process() -> None:
    with spawn_fake_deepseek("--no-validate") as fake:
        assert fake.control.config()["validate"] is False
        odd = chat(messages=[{"role": "developer", "content": "x"}])
        response = httpx2.post(f"{fake.url}/chat/completions", json=odd, headers=AUTH, timeout=10)
        assert response.status_code == 200


def test_state_rejects_unknown_fault() -> None:
    with pytest.raises(ValueError, match="unknown fault"):
        FakeState(fault="explode")
