"""Tests of the fake DeepSeek's Anthropic-format route, over real loopback HTTP, with httpx2 and the
`anthropic` SDK."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import orjson
import pytest
from anthropic.types import MessageParam, ToolParam
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatgate.demo.anthropic_rules import anthropic_error
from chatgate.demo.rules import DESERIALIZE
from tests.fakes.server import RunningFake, run_fake_deepseek

KEY = "sk-test-0001"
PATH = "/anthropic/v1/messages"
USER: list[MessageParam] = [{"role": "user", "content": "hi"}]
TOOLS: list[ToolParam] = [
    {"name": "search", "input_schema": {"type": "object"}},
    {"name": "fetch", "input_schema": {"type": "object"}},
]
SONNET, OPUS = "claude-sonnet-5-5", "claude-opus-5-5"
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
def client(fake: RunningFake) -> Iterator[anthropic.Anthropic]:
    sdk = anthropic.Anthropic(base_url=f"{fake.url}/anthropic", api_key=KEY, max_retries=0, timeout=10)
    with sdk:
        yield sdk


@pytest.fixture
def http(fake: RunningFake) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=fake.url, headers={"x-api-key": KEY}, timeout=10) as raw:
        yield raw


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "deepseek-flash", "max_tokens": 1024, "messages": USER, **extra}


def events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of a named-event SSE stream; asserts every event carries its name."""
    found = []
    for raw in text.split("\n\n"):
        if not raw or raw.startswith(":"):
            continue
        name_line, data_line = raw.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: "), raw
        data = orjson.loads(data_line[6:])
        assert data["type"] == name_line[7:]
        found.append((name_line[7:], data))
    return found


def tool_use(tool_id: str = "call_00_a", name: str = "search") -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": {"q": "x"}}


def tool_result(tool_id: str = "call_00_a", content: Any = "sunny") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_id, "content": content}


THOUGHT = {"type": "thinking", "thinking": "t", "signature": "s"}


def history(*messages: Any, **extra: Any) -> dict[str, Any]:
    """A body: USER, then the given messages."""
    return body(messages=[*USER, *messages], **extra)


def tool_turn(*tool_uses: dict[str, Any], thinking: dict[str, Any] | None = THOUGHT) -> dict[str, Any]:
    content = [thinking, *tool_uses] if thinking is not None else list(tool_uses)
    return {"role": "assistant", "content": content}


def results(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


# ------------------------------------------------------------------------------------------ answers


def test_nonstream_text_with_thinking_and_usage(client: anthropic.Anthropic, fake: RunningFake) -> None:
    message = client.messages.create(model=SONNET, max_tokens=1024, messages=USER)
    assert str(uuid.UUID(message.id)) == message.id  # DeepSeek's ids are UUIDs, not msg_…
    assert (message.type, message.role, message.model) == ("message", "assistant", "deepseek-flash")
    thinking, text = message.content
    assert thinking.type == "thinking" and thinking.thinking and thinking.signature == message.id
    assert text.type == "text" and text.text == "Answer 1: the fake DeepSeek says hello."
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    usage = message.usage
    assert usage.input_tokens > 0 and usage.cache_read_input_tokens and usage.cache_creation_input_tokens == 0
    assert usage.output_tokens == len(thinking.thinking.split()) + len(text.text.split())
    assert fake.state.wait_idle(5)
    (rec,) = fake.state.requests
    assert rec.path == PATH and rec.auth_key == KEY and rec.outcome == "completed" and rec.usage_sent
    assert rec.usage is not None and rec.usage["output_tokens"] == usage.output_tokens


def test_same_request_same_answer(http: httpx2.Client) -> None:
    first, second = (http.post(PATH, json=body()).json() for _ in range(2))
    assert first["id"] != second["id"] and first["usage"] == second["usage"]
    for message in (first, second):
        assert message["content"][0]["signature"] == message["id"]
        message["content"][0]["signature"] = "-"
    assert first["content"] == second["content"]


@pytest.mark.parametrize(
    ("sent", "served"),
    [
        (OPUS, "deepseek-v4-pro"),
        ("claude-opus-4-7[1m]", "deepseek-v4-pro"),
        ("claude-3-opus-20240229", "deepseek-v4-pro"),
        (SONNET, "deepseek-flash"),
        ("claude-haiku-4-5-20251001", "deepseek-flash"),
        ("claude-fable-5", "deepseek-flash"),
        ("claude-whatever", "deepseek-flash"),
        ("deepseek-flash", "deepseek-flash"),
        ("deepseek-v4-pro", "deepseek-v4-pro"),
        ("deepseek-v4-flash", "deepseek-v4-flash"),
        ("deepseek-v4-pro[1m]", "deepseek-flash"),
    ],
)
def test_model_served(http: httpx2.Client, sent: str, served: str) -> None:
    response = http.post(PATH, json=body(model=sent))
    assert response.status_code == 200 and response.json()["model"] == served


def test_thinking_off_and_on(http: httpx2.Client) -> None:
    for thinking in ({"type": "enabled", "budget_tokens": 2048}, {"type": "adaptive"}, None):
        content = http.post(PATH, json=body(thinking=thinking)).json()["content"]
        assert [block["type"] for block in content] == ["thinking", "text"]
    message = http.post(PATH, json=body(thinking={"type": "disabled"})).json()
    assert [block["type"] for block in message["content"]] == ["text"]
    assert message["usage"]["output_tokens"] == 7


def test_tool_use_answer(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model=OPUS, max_tokens=1024, messages=USER, tools=TOOLS)
    assert message.model == "deepseek-v4-pro" and message.stop_reason == "tool_use"
    thinking, call = message.content
    assert thinking.type == "thinking" and call.type == "tool_use"
    assert call.id.startswith("call_00_") and call.name == "search" and call.input == {"q": "x"}


def test_forced_tool_and_tool_choice_none(http: httpx2.Client) -> None:
    forced = body(tools=TOOLS, tool_choice={"type": "tool", "name": "fetch"}, thinking={"type": "disabled"})
    content = http.post(PATH, json=forced).json()["content"]
    assert [(block["type"], block.get("name")) for block in content] == [("tool_use", "fetch")]
    anyone = body(tools=TOOLS, tool_choice={"type": "any"}, thinking={"type": "disabled"})
    assert http.post(PATH, json=anyone).json()["content"][0]["name"] == "search"
    silent = http.post(PATH, json=body(tools=TOOLS, tool_choice={"type": "none"})).json()
    assert silent["stop_reason"] == "end_turn" and silent["content"][-1]["type"] == "text"
    server_tool = [{"type": "web_search_20250305", "name": "web_search"}]
    assert http.post(PATH, json=body(tools=server_tool)).json()["stop_reason"] == "end_turn"


def test_tool_loop_two_rounds(client: anthropic.Anthropic, fake: RunningFake) -> None:
    first = client.messages.create(model=SONNET, max_tokens=1024, messages=USER, tools=TOOLS)
    thought, call = first.content
    assert thought.type == "thinking" and call.type == "tool_use"
    turn: list[MessageParam] = [
        *USER,
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}]},
    ]
    second = client.messages.create(model=SONNET, max_tokens=1024, messages=turn, tools=TOOLS)
    assert second.stop_reason == "end_turn"
    assert second.content[-1].type == "text" and second.content[-1].text == "Answer 3: the tool said sunny"
    with client.messages.stream(model=SONNET, max_tokens=1024, messages=turn, tools=TOOLS) as stream:
        streamed = stream.get_final_message()
    assert streamed.content[-1].type == "text" and streamed.content[-1].text.endswith("said sunny")
    sent = fake.state.requests[1].json["messages"][1]["content"]
    assert sent[0] == {"type": "thinking", "thinking": thought.thinking, "signature": first.id}
    # Without the thinking block DeepSeek refuses the replay; an empty one is enough.
    stripped: list[MessageParam] = [*turn[:1], {"role": "assistant", "content": [call]}, *turn[2:]]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=SONNET, max_tokens=1024, messages=stripped, tools=TOOLS)
    assert caught.value.body == {
        "error": {
            "message": "The `content[].thinking` in the thinking mode must be passed back to the API.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_request_error",
        }
    }
    empty: MessageParam = {
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": "", "signature": ""}, call],
    }
    again = client.messages.create(
        model=SONNET, max_tokens=1024, messages=[*turn[:1], empty, *turn[2:]], tools=TOOLS
    )
    assert again.stop_reason == "end_turn"


def test_max_tokens_stop_reason(http: httpx2.Client) -> None:
    short = http.post(PATH, json=body(max_tokens=3, thinking={"type": "disabled"})).json()
    assert short["stop_reason"] == "max_tokens" and short["usage"]["output_tokens"] == 3
    assert short["content"] == [{"type": "text", "text": "Answer 1: the"}]
    thinking_only = http.post(PATH, json=body(max_tokens=2)).json()
    assert [block["type"] for block in thinking_only["content"]] == ["thinking"]
    assert thinking_only["stop_reason"] == "max_tokens" and thinking_only["usage"]["output_tokens"] == 2


def test_both_paths_and_query_string(http: httpx2.Client, fake: RunningFake) -> None:
    for path in (f"{PATH}?beta=true", "/anthropic/messages", "/anthropic/messages?beta=true"):
        assert http.post(path, json=body()).json()["type"] == "message"
    assert [rec.path for rec in fake.state.requests] == [PATH, *["/anthropic/messages"] * 2]
    assert http.get(PATH).status_code == 405
    assert http.post("/anthropic/v1/messages/count_tokens", json=body()).status_code == 404


# ------------------------------------------------------------------------------------------ streaming


def test_sdk_stream_text(client: anthropic.Anthropic, http: httpx2.Client) -> None:
    with client.messages.stream(model=SONNET, max_tokens=1024, messages=USER) as stream:
        pieces = list(stream.text_stream)
        message = stream.get_final_message()
    assert "".join(pieces) == "Answer 1: the fake DeepSeek says hello." and len(pieces) == 7
    thinking, text = message.content
    assert thinking.type == "thinking" and thinking.signature == message.id
    assert text.type == "text" and text.text == "".join(pieces)
    assert message.stop_reason == "end_turn" and message.model == "deepseek-flash"
    nonstream = http.post(PATH, json=body(model=SONNET)).json()
    assert message.usage.output_tokens == nonstream["usage"]["output_tokens"]
    assert message.usage.input_tokens > 0 and message.usage.cache_read_input_tokens


def test_sdk_stream_tool_use_and_raw_events(client: anthropic.Anthropic) -> None:
    stream = client.messages.create(model=SONNET, max_tokens=1024, messages=USER, tools=TOOLS, stream=True)
    names = [event.type for event in stream]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    with client.messages.stream(model=SONNET, max_tokens=1024, messages=USER, tools=TOOLS) as managed:
        message = managed.get_final_message()
    call = message.content[-1]
    assert call.type == "tool_use" and call.input == {"q": "x"} and message.stop_reason == "tool_use"


def test_stream_wire_format(http: httpx2.Client, fake: RunningFake) -> None:
    response = http.post(PATH, json=body(stream=True, tools=TOOLS))
    assert response.headers["content-type"].startswith("text/event-stream")
    text = response.text
    assert text.startswith(": keep-alive\n\nevent: message_start\n") and "[DONE]" not in text
    found = events(text)
    names = [name for name, _ in found]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-2:] == ["message_delta", "message_stop"]
    start = found[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 1
    blocks = [data["content_block"] for name, data in found if name == "content_block_start"]
    assert blocks[0] == {"type": "thinking", "thinking": ""}  # no signature field, as DeepSeek
    assert (
        blocks[1]["type"] == "tool_use" and blocks[1]["input"] == {} and blocks[1]["id"].startswith("call_")
    )
    deltas = [data["delta"] for name, data in found if name == "content_block_delta"]
    assert {"type": "signature_delta", "signature": start["id"]} in deltas
    partial = "".join(d["partial_json"] for d in deltas if d["type"] == "input_json_delta")
    assert orjson.loads(partial) == {"q": "x"}
    final = found[-2][1]
    assert final["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    rec = fake.state.requests[-1]
    assert rec.usage is not None and final["usage"] == {
        key: rec.usage[key]
        for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")
    }
    assert final["usage"]["input_tokens"] == start["usage"]["input_tokens"]
    assert final["usage"]["output_tokens"] == rec.completion_tokens_sent == 12
    indexes = [data["index"] for name, data in found if name.startswith("content_block")]
    assert indexes == sorted(indexes) and set(indexes) == {0, 1}


def test_stream_without_ping_and_signature(client: anthropic.Anthropic, http: httpx2.Client) -> None:
    headers = {"x-fake-ping": "0", "x-fake-signature-delta": "0"}
    found = events(http.post(PATH, json=body(stream=True), headers=headers).text)
    assert "ping" not in [name for name, _ in found]
    assert all(
        data["delta"]["type"] != "signature_delta" for name, data in found if name == "content_block_delta"
    )
    stream = client.messages.create(
        model=SONNET, max_tokens=1024, messages=USER, stream=True, extra_headers=headers
    )
    assert [event.type for event in stream][:2] == ["message_start", "content_block_start"]
    with client.messages.stream(
        model=SONNET, max_tokens=1024, messages=USER, tools=TOOLS, extra_headers=headers
    ) as managed:
        message = managed.get_final_message()
    thinking, call = message.content
    assert thinking.type == "thinking" and thinking.signature is None and call.type == "tool_use"
    replay: list[MessageParam] = [
        *USER,
        {"role": "assistant", "content": message.content},  # sends "signature": null back
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "ok"}]},
    ]
    again = client.messages.create(model=SONNET, max_tokens=1024, messages=replay, tools=TOOLS)
    assert again.stop_reason == "end_turn"


def test_keepalives_and_chunk_delay(
    client: anthropic.Anthropic, http: httpx2.Client, fake: RunningFake
) -> None:
    fake.state.configure(keepalive_count=3)
    text = http.post(PATH, json=body(stream=True)).text
    assert text.startswith(": keep-alive\n\n" * 3 + "event: message_start\n")
    fake.state.configure(keepalive_count=0, chunk_delay=0.03)
    arrivals = []
    with client.messages.stream(model=SONNET, max_tokens=1024, messages=USER) as stream:
        for _ in stream:
            arrivals.append(time.monotonic())
    assert len(arrivals) > 15 and arrivals[-1] - arrivals[0] > 0.3
    fake.state.configure(chunk_delay=0.0)
    started = time.monotonic()
    http.post(PATH, json=body(stream=True), headers={"x-fake-chunk-delay": "0.02"})
    assert time.monotonic() - started > 0.3


def test_client_disconnect_is_recorded(fake: RunningFake) -> None:
    headers = {"x-api-key": KEY, "x-fake-chunk-delay": "0.05", "x-request-id": "req-cut"}
    with httpx2.stream("POST", f"{fake.url}{PATH}", headers=headers, json=body(stream=True)) as response:
        seen = 0
        for line in response.iter_lines():
            seen += line.startswith("event: ")
            if seen == 6:
                break
    assert fake.state.wait_idle(5)
    (entry,) = fake.state.issued_report()["requests"]
    assert entry["request_id"] == "req-cut" and entry["outcome"] == "client_disconnected"
    assert entry["cut_short"] and not entry["usage_sent"]
    assert 0 < entry["completion_tokens_sent"] < entry["usage"]["output_tokens"]
    assert KEY not in fake.state.issued_usage


# ------------------------------------------------------------------------------------------ auth


def test_x_api_key_and_bearer(fake: RunningFake) -> None:
    url = f"{fake.url}{PATH}"
    assert httpx2.post(url, json=body(), headers={"x-api-key": "sk-k1"}).status_code == 200
    assert httpx2.post(url, json=body(), headers={"Authorization": "Bearer sk-k2"}).status_code == 200
    both_good_bearer = {"Authorization": "Bearer sk-k3", "x-api-key": "sk-bad-1111"}
    assert httpx2.post(url, json=body(), headers=both_good_bearer).status_code == 200
    both_bad_bearer = {"Authorization": "Bearer sk-bad-2222", "x-api-key": "sk-k4"}
    refused = httpx2.post(url, json=body(), headers=both_bad_bearer)
    assert refused.status_code == 401 and refused.json() == {
        "error": {
            "message": "Authentication Fails, Your api key: ****2222 is invalid",
            "type": "authentication_error",
            "param": None,
            "code": "invalid_request_error",
        }
    }
    missing = httpx2.post(url, json=body(), headers={"anthropic-version": "2023-06-01"})
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
    keys = [rec.auth_key for rec in fake.state.requests]
    assert keys == ["sk-k1", "sk-k2", "sk-k3", "sk-bad-2222", None]
    assert fake.state.requests[3].status == 401 and fake.state.requests[3].usage is None


def test_sdk_auth_errors(fake: RunningFake) -> None:
    bad = anthropic.Anthropic(base_url=f"{fake.url}/anthropic", api_key="sk-bad-abcd", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        bad.messages.create(model=SONNET, max_tokens=10, messages=USER)
    assert caught.value.status_code == 401
    fake.state.configure(valid_keys=["sk-other"])
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=f"{fake.url}/anthropic", auth_token=KEY, max_retries=0).messages.create(
            model=SONNET, max_tokens=10, messages=USER
        )
    other = anthropic.Anthropic(base_url=f"{fake.url}/anthropic", auth_token="sk-other", max_retries=0)
    assert other.messages.create(model=SONNET, max_tokens=10, messages=USER).content


# ------------------------------------------------------------------------------------------ validation

PASS_BACK = "The `content[].thinking` in the thinking mode must be passed back to the API."
MAX_RANGE = "Invalid max_tokens value, the valid range of max_tokens is [1, 393216]"
EFFORT_CONFLICT = "thinking options type cannot be disabled when reasoning_effort is set"
THINKING_CHOICE = "Thinking mode does not support this tool_choice"
UNANSWERED = (
    "messages.{}:`tool_use` ids were found without `tool_result` blocks immediately after: {}. "
    "Each `tool_use` block must have a corresponding `tool_result` block in the next message."
)


def serde(text: str) -> str:
    """A regex for a deserializer message: the prefix, `text`, then the position."""
    return "^" + re.escape(f"{DESERIALIZE} {text} at line 1 column ") + r"\d+$"


REFUSED: dict[str, tuple[Any, str]] = {
    # name: (body, DeepSeek's message: exact, or a regex when it starts with "^")
    "A1 no model": ({"max_tokens": 5, "messages": USER}, serde("missing field `model`")),
    "A1 no messages": ({"model": "deepseek-flash", "max_tokens": 5}, serde("missing field `messages`")),
    "A1 messages not a list": (
        body(messages={"role": "user"}),
        serde("messages: invalid type: map, expected a sequence"),
    ),
    "A1 model not a string": (body(model=5), serde("model: invalid type: integer `5`, expected a string")),
    "A1 not an object": ([1], serde("invalid type: sequence, expected a map")),
    "A2 no max_tokens": ({"model": "deepseek-flash", "messages": USER}, serde("missing field `max_tokens`")),
    "A2 zero": (body(max_tokens=0), MAX_RANGE),
    "A2 above 384K": (body(max_tokens=393217), MAX_RANGE),
    "A2 string": (body(max_tokens="5"), serde('max_tokens: invalid type: string "5", expected u32')),
    "A2 null": (body(max_tokens=None), serde("max_tokens: invalid type: null, expected u32")),
    "A3 system role": (
        body(messages=[*USER, {"role": "system", "content": "s"}]),
        # the enum grew by latest_reminder in 2026-11 (DeepSeek's new list: inferred)
        serde("messages[1].role: unknown variant `system`, expected one of `user`, `assistant`, "
              "`latest_reminder`"),
    ),
    "A3 tool role": (
        body(messages=[{"role": "tool", "content": "s"}]),
        serde("messages[0].role: unknown variant `tool`, expected one of `user`, `assistant`, "
              "`latest_reminder`"),
    ),
    "A3 no content": (body(messages=[{"role": "user"}]), serde("messages[0]: missing field `content`")),
    "A4 unknown block": (
        body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]),
        "^"
        + re.escape(
            f"{DESERIALIZE} messages[0].content: unknown variant `image_url`, "
            "expected one of `text`, `image`, "
        ),
    ),
    "A4 tool_reference in tool_result": (
        history(
            tool_turn(tool_use()),
            results(tool_result(content=[{"type": "tool_reference", "tool_name": "x"}])),
        ),
        "^"
        + re.escape(f"{DESERIALIZE} messages[2].content: unknown variant `tool_reference`, expected one of"),
    ),
    "A4 text block without text": (
        body(messages=[{"role": "user", "content": [{"type": "text"}]}]),
        serde("messages[0].content: missing field `text`"),
    ),
    "A6 empty assistant": (
        history({"role": "assistant", "content": []}, *USER),
        "messages.1: all messages must have non-empty content",
    ),
    "A7 no results": (history(tool_turn(tool_use()), *USER), UNANSWERED.format(1, "call_00_a")),
    "A7 one of two answered": (
        history(tool_turn(tool_use("a"), tool_use("b")), results(tool_result("b"))),
        UNANSWERED.format(1, "a"),
    ),
    "A7 results split over two messages": (
        history(
            tool_turn(tool_use("a"), tool_use("b"), tool_use("c")),
            results(tool_result("a")),
            results(tool_result("b"), tool_result("c")),
        ),
        UNANSWERED.format(1, "b, c"),
    ),
    "A7 tool_use at the end": (history(tool_turn(tool_use("z"))), UNANSWERED.format(1, "z")),
    "A9 thinking without thinking": (
        history(
            tool_turn(tool_use(), thinking={"type": "thinking", "signature": "s"}), results(tool_result())
        ),
        serde("messages[1].content: missing field `thinking`"),
    ),
    "A10 thinking not passed back": (
        history(tool_turn(tool_use(), thinking=None), results(tool_result())),
        PASS_BACK,
    ),
    "A10 adaptive": (
        history(tool_turn(tool_use(), thinking=None), results(tool_result()), thinking={"type": "adaptive"}),
        PASS_BACK,
    ),
    "A10 redacted_thinking does not count": (
        history(
            tool_turn(tool_use(), thinking={"type": "redacted_thinking", "data": "x"}), results(tool_result())
        ),
        PASS_BACK,
    ),
    "A11 thinking auto": (
        body(thinking={"type": "auto"}),
        serde("thinking.type: unknown variant `auto`, expected one of `adaptive`, `enabled`, `disabled`"),
    ),
    "A11 thinking without type": (
        body(thinking={"budget_tokens": 5}),
        serde("thinking: missing field `type`"),
    ),
    "A12 disabled with effort": (
        body(thinking={"type": "disabled"}, output_config={"effort": "max"}),
        EFFORT_CONFLICT,
    ),
    "A13 forced tool": (body(tools=TOOLS, tool_choice={"type": "tool", "name": "search"}), THINKING_CHOICE),
    "A13 any": (
        body(tools=TOOLS, tool_choice={"type": "any"}, thinking={"type": "enabled"}),
        THINKING_CHOICE,
    ),
    "A18 unknown model": (
        body(model="deepseek-v4.1-flash"),
        "The supported API model names are deepseek-flash, deepseek-v4-pro, "
        "but you passed deepseek-v4.1-flash.",
    ),
    "A18 retired model": (body(model="deepseek-chat"), "^The supported API model names are "),
    "A18 gpt": (body(model="gpt-4o"), "^The supported API model names are .* but you passed gpt-4o.$"),
    "A20 temperature": (
        body(temperature=2.5),
        "Invalid temperature value, the valid range of temperature is [0, 2]",
    ),
    "A20 negative temperature": (body(temperature=-0.1), "^Invalid temperature value"),
    "A20 top_p": (body(top_p=1.5), "Invalid top_p value, the valid range of top_p is [0, 1]"),
    "A20 temperature string": (
        body(temperature="1"),
        serde('temperature: invalid type: string "1", expected f32'),
    ),
    "tool_choice unknown": (
        body(tools=TOOLS, tool_choice={"type": "required"}),
        serde("tool_choice: unknown variant `required`, expected one of `auto`, `any`, `tool`, `none`"),
    ),
    "stream not a boolean": (
        body(stream="yes"),
        serde('stream: invalid type: string "yes", expected a boolean'),
    ),
}

CLAUDE_CODE: dict[str, Any] = {
    "model": "claude-opus-4-8",
    "max_tokens": 64000,
    "stream": True,
    "system": [
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "More.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
    ],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}
    ],
    "tools": [
        {
            "name": "Bash",
            "description": "run",
            "input_schema": {"type": "object"},
            "cache_control": {"type": "ephemeral"},
        },
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 8},
    ],
    "thinking": {"type": "adaptive"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "xhigh"},
    "metadata": {"user_id": '{"device_id":"ea10","account_uuid":"","session_id":"db60"}'},
    "temperature": 1,
}

ACCEPTED: dict[str, dict[str, Any]] = {
    "A1/A23 Claude Code body": CLAUDE_CODE,
    "A2 bounds": body(max_tokens=393216),
    "A2 one": body(max_tokens=1, thinking={"type": "disabled"}),
    "A3 user and assistant": body(messages=[*USER, {"role": "assistant", "content": "a"}, *USER]),
    "A3 assistant last (prefill)": body(messages=[*USER, {"role": "assistant", "content": "The answer"}]),
    "A4 every supported block": history(
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look", "citations": None},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
                },
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {"query": "x"}},
                {"type": "web_search_tool_result", "tool_use_id": "srv_1", "content": []},
                {"type": "text", "text": "found"},
            ],
        },
        *USER,
    ),
    "A5 not-supported blocks": history(
        {
            "role": "user",
            "content": [
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "d"}},
                {"type": "search_result", "source": "s", "title": "t", "content": []},
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "redacted_thinking", "data": "x"}, {"type": "text", "text": "a"}],
        },
        *USER,
    ),
    "A6 empty string content": history({"role": "assistant", "content": ""}, *USER),
    "A6 whitespace text block": history(
        {"role": "assistant", "content": [{"type": "text", "text": " "}]}, *USER
    ),
    "A6 empty user content": history({"role": "assistant", "content": "a"}, {"role": "user", "content": []}),
    "A7 parallel results in one message, any order": history(
        tool_turn(tool_use("a"), tool_use("b")),
        results(
            {"type": "text", "text": "here"},
            tool_result("b"),
            tool_result("a", [{"type": "text", "text": "s"}]),
        ),
    ),
    "A8 result for an unknown id": history(
        tool_turn(tool_use("a")), results(tool_result("a"), {**tool_result("zzz"), "is_error": True})
    ),
    "A9/A10 empty thinking, no signature": history(
        tool_turn(tool_use(), thinking={"type": "thinking", "thinking": ""}), results(tool_result())
    ),
    "A10 plain-text turns need no thinking": history(
        {"role": "assistant", "content": [{"type": "text", "text": "a"}]}, *USER
    ),
    "A10 thinking disabled": history(
        tool_turn(tool_use(), thinking=None), results(tool_result()), thinking={"type": "disabled"}
    ),
    "A10 thinking after the tool_use": history(
        {"role": "assistant", "content": [tool_use(), THOUGHT]}, results(tool_result())
    ),
    "A11 adaptive": body(thinking={"type": "adaptive"}),
    "A11 enabled with budget": body(thinking={"type": "enabled", "budget_tokens": 10000}),
    "A11 null": body(thinking=None),
    "A12 disabled alone": body(thinking={"type": "disabled"}),
    "A12 disabled + top-level reasoning_effort": body(thinking={"type": "disabled"}, reasoning_effort="high"),
    "A12 disabled + effort null": body(thinking={"type": "disabled"}, output_config={"effort": None}),
    "A13 disabled + forced tool": body(
        tools=TOOLS, tool_choice={"type": "tool", "name": "fetch"}, thinking={"type": "disabled"}
    ),
    "A13 thinking + auto": body(tools=TOOLS, tool_choice={"type": "auto", "disable_parallel_tool_use": True}),
    "A13 thinking + none": body(tools=TOOLS, tool_choice={"type": "none"}),
    "A14 any effort": body(output_config={"effort": "ultra"}),
    "A15 user_id with odd characters": body(metadata={"user_id": "a b/c{}"}),
    "A17 other server tools": body(tools=[{"type": "web_fetch_20250910", "name": "web_fetch"}]),
    "A20 bounds": body(temperature=2, top_p=0),
    "A20 temperature in thinking mode": body(temperature=0.0, top_p=1.0, top_k=5),
    "A22 huge max_tokens with a long prompt": body(max_tokens=393216, system="x" * 10000),
    "A23 unknown fields": body(
        container="c",
        mcp_servers=[],
        service_tier="auto",
        top_k=3,
        stop_sequences=["END"],
        inference_geo="us",
    ),
    "claude names": body(model="claude-mythos-5-2"),
    "legacy flash names": body(model="deepseek-v4-flash-vision-exp"),
}


@pytest.mark.parametrize(("sent", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_refuses_what_deepseek_refuses(
    http: httpx2.Client, fake: RunningFake, sent: Any, message: str
) -> None:
    response = http.post(PATH, json=sent)
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ENVELOPE
    if message.startswith("^"):
        assert re.match(message, error["message"]), error["message"]
    else:
        assert error["message"] == message
    (rec,) = fake.state.requests
    assert rec.refused == error["message"] and rec.outcome == "error_response" and rec.usage is None
    assert bytes(rec.sent) == response.content


@pytest.mark.parametrize("sent", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_accepts_what_deepseek_accepts(http: httpx2.Client, sent: dict[str, Any]) -> None:
    response = http.post(PATH, json=sent, headers={"anthropic-beta": "context-management-2025-06-27"})
    assert response.status_code == 200, response.text
    if sent.get("stream"):
        assert [name for name, _ in events(response.text)][-1] == "message_stop"
    else:
        assert response.json()["type"] == "message"


def test_bad_json_is_refused(http: httpx2.Client) -> None:
    response = http.post(PATH, content=b'{"model": ', headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("Failed to parse the request body as JSON")


def test_sdk_raises_bad_request(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model=SONNET,
            max_tokens=1024,
            messages=USER,
            thinking={"type": "disabled"},
            output_config={"effort": "high"},
        )
    assert caught.value.status_code == 400
    assert caught.value.body == {
        "error": {
            "message": EFFORT_CONFLICT,
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_request_error",
        }
    }


def test_validation_can_be_switched_off(http: httpx2.Client, fake: RunningFake) -> None:
    odd = body(
        model="gpt-4o", messages=[{"role": "system", "content": "x"}], thinking={"type": "auto"}, max_tokens=0
    )
    assert http.post(PATH, json=odd).status_code == 400
    fake.state.configure(validate=False)
    accepted = http.post(PATH, json=odd)
    assert accepted.status_code == 200
    assert accepted.json()["model"] == "gpt-4o" and accepted.json()["stop_reason"] == "max_tokens"
    assert http.post(PATH, json={"messages": "x"}).status_code == 200
    assert http.post(PATH, content=b"[1]").status_code == 400  # still a JSON object only


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
BASES = [*ACCEPTED.values(), *(sent for sent, _ in REFUSED.values() if isinstance(sent, dict))]
KEYS = [
    "messages",
    "tools",
    "thinking",
    "tool_choice",
    "max_tokens",
    "model",
    "output_config",
    "metadata",
    "x",
]


@pytest.mark.slow  # a property test over 300 examples
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(base=st.sampled_from(BASES), key=st.sampled_from(KEYS), value=json_values, index=st.integers(0, 3))
def test_rules_never_raise(base: dict[str, Any], key: str, value: Any, index: int) -> None:
    """Any JSON in any field, also inside a message, its content or a tool: a message or None, never an
    exception; and the answer can always be planned."""
    from chatgate.demo.anthropic import make_plan

    sent = orjson.loads(orjson.dumps(base))
    target: Any = sent
    slot: Any = key
    if key == "messages" and isinstance(sent.get("messages"), list) and index < len(sent["messages"]):
        message = sent["messages"][index]
        target, slot = (message, "content") if isinstance(message, dict) else (sent["messages"], index)
        if isinstance(message, dict) and isinstance(message.get("content"), list) and message["content"]:
            target, slot = message["content"], min(index, len(message["content"]) - 1)
    target[slot] = value
    problem = anthropic_error(sent, 100)
    assert problem is None or isinstance(problem, str)
    make_plan(sent)


# ------------------------------------------------------------------------------------------ faults


@pytest.mark.parametrize(
    ("fault", "error", "status", "message"),
    [
        ("http_400", anthropic.BadRequestError, 400, "Content Exists Risk"),
        ("http_402", anthropic.APIStatusError, 402, "Insufficient Balance"),
        ("http_429", anthropic.RateLimitError, 429, "Your current concurrency is 40"),
        ("http_500", anthropic.InternalServerError, 500, "Internal Server Error"),
        ("http_503", anthropic.InternalServerError, 503, "Server Overloaded"),
        ("http_401", anthropic.AuthenticationError, 401, "Authentication Fails"),
    ],
)
def test_status_faults(
    client: anthropic.Anthropic, fault: str, error: type[anthropic.APIStatusError], status: int, message: str
) -> None:
    with pytest.raises(error) as caught:
        client.messages.create(
            model=SONNET, max_tokens=10, messages=USER, extra_headers={"x-fake-fault": fault}
        )
    assert caught.value.status_code == status
    assert isinstance(caught.value.body, dict) and caught.value.body["error"]["message"].startswith(message)
    assert caught.value.body["error"]["code"] == "invalid_request_error"


def test_global_fault_with_count(http: httpx2.Client, fake: RunningFake) -> None:
    fake.state.configure(fault="http_503", fault_count=1)
    assert http.post(PATH, json=body()).status_code == 503
    assert http.post(PATH, json=body()).status_code == 200
    assert http.post(PATH, json=body(), headers={"x-fake-fault": "explode"}).status_code == 400


def test_error_mid_stream(client: anthropic.Anthropic, http: httpx2.Client, fake: RunningFake) -> None:
    text = http.post(PATH, json=body(stream=True), headers={"x-fake-fault": "error_mid_stream"}).text
    found = events(text)
    assert [name for name, _ in found] == ["message_start", "ping", "content_block_start", "error"]
    assert found[-1][1] == {
        "type": "error",
        "error": {"type": "api_error", "message": "Internal Server Error"},
    }
    assert fake.state.requests[-1].outcome == "stream_error"
    stream = client.messages.create(
        model=SONNET,
        max_tokens=10,
        messages=USER,
        stream=True,
        extra_headers={"x-fake-fault": "error_mid_stream"},
    )
    with pytest.raises(anthropic.APIStatusError, match="Internal Server Error"):
        list(stream)


def test_reset_mid_stream(client: anthropic.Anthropic, fake: RunningFake) -> None:
    received = bytearray()
    with (
        pytest.raises(httpx2.TransportError),
        httpx2.stream(
            "POST",
            f"{fake.url}{PATH}",
            headers={"x-api-key": KEY, "x-fake-fault": "reset_mid_stream"},
            json=body(stream=True),
        ) as response,
    ):
        for piece in response.iter_raw():
            received += piece
    assert fake.state.wait_idle(5)
    rec = fake.state.requests[-1]
    assert rec.outcome == "reset" and rec.sent == received and received.count(b"event: ") == 3
    assert not rec.usage_sent and KEY not in fake.state.issued_usage
    with pytest.raises(anthropic.APIError):
        client.messages.create(
            model=SONNET, max_tokens=10, messages=USER, extra_headers={"x-fake-fault": "reset_mid_stream"}
        )


def test_short_stall_and_slow(http: httpx2.Client) -> None:
    stalled = http.post(
        PATH, json=body(stream=True), headers={"x-fake-fault": "stall_mid_stream", "x-fake-delay": "0.1"}
    )
    assert [name for name, _ in events(stalled.text)][-1] == "message_stop"
    slow = http.post(PATH, json=body(), headers={"x-fake-fault": "slow", "x-fake-delay": "0.1"})
    assert slow.json()["type"] == "message"


# ------------------------------------------------------------------------------------------ records


def test_sent_is_every_byte_the_client_received(http: httpx2.Client, fake: RunningFake) -> None:
    fake.state.configure(keepalive_count=2, nonstream_keepalive_lines=2, chunk_delay=0.001)
    raw = orjson.dumps(body(stream=True, tools=TOOLS))
    responses = [
        http.post(f"{PATH}?beta=true", content=raw, headers={"content-type": "application/json"}),
        http.post(PATH, json=body()),
        http.post(PATH, json=body(max_tokens=0)),
        http.post(PATH, json=body(), headers={"x-fake-fault": "http_429"}),
    ]
    assert [r.status_code for r in responses] == [200, 200, 400, 429]
    assert [bytes(rec.sent) for rec in fake.state.requests] == [r.content for r in responses]
    assert fake.state.requests[0].body == raw and fake.state.requests[0].stream
    assert (
        responses[1].content.startswith(b"\n\n{") and orjson.loads(responses[1].content)["type"] == "message"
    )


def test_per_key_usage_totals(http: httpx2.Client, fake: RunningFake, client: anthropic.Anthropic) -> None:
    answers = [
        http.post(PATH, json=body()).json()["usage"],
        http.post(PATH, json=body(tools=TOOLS, thinking={"type": "disabled"})).json()["usage"],
        client.messages.create(model=SONNET, max_tokens=1024, messages=USER).usage.model_dump(),
    ]
    with client.messages.stream(model=SONNET, max_tokens=1024, messages=USER) as stream:
        answers.append(stream.get_final_message().usage.model_dump())
    other = httpx2.post(f"{fake.url}{PATH}", json=body(), headers={"Authorization": "Bearer sk-other"}).json()
    openai_route = httpx2.post(
        f"{fake.url}/chat/completions",
        json={"model": "deepseek-flash", "messages": USER},
        headers={"Authorization": f"Bearer {KEY}"},
    ).json()["usage"]
    assert fake.state.wait_idle(5)
    totals = fake.state.issued_usage[KEY]

    def total(name: str) -> int:
        return sum(int(usage[name]) for usage in answers)

    assert totals["anthropic_requests"] == 4 and totals["requests"] == 5
    for name in ("input_tokens", "cache_read_input_tokens", "output_tokens"):
        assert totals[name] == total(name)
    assert totals["cache_creation_input_tokens"] == 0
    assert (
        totals["prompt_tokens"]
        == total("input_tokens") + total("cache_read_input_tokens") + openai_route["prompt_tokens"]
    )
    assert (
        totals["prompt_cache_hit_tokens"]
        == total("cache_read_input_tokens") + openai_route["prompt_cache_hit_tokens"]
    )
    assert (
        totals["prompt_cache_miss_tokens"] == total("input_tokens") + openai_route["prompt_cache_miss_tokens"]
    )
    assert totals["completion_tokens"] == total("output_tokens") + openai_route["completion_tokens"]
    assert totals["total_tokens"] == totals["prompt_tokens"] + totals["completion_tokens"]
    assert totals["reasoning_tokens"] == openai_route["completion_tokens_details"]["reasoning_tokens"]
    assert (
        totals["thinking_tokens"] == 3 * 8
    )  # three answers thought "The user sent 1 messages; I will answer."
    assert fake.state.issued_usage["sk-other"]["output_tokens"] == other["usage"]["output_tokens"]
    report = http.get("/_fake/issued").json()
    assert report["per_key"][KEY] == totals
    assert [entry["usage"]["output_tokens"] for entry in report["requests"][:4]] == [
        u["output_tokens"] for u in answers
    ]


def test_a_tool_loop_of_several_rounds_then_text(fake: RunningFake, http: httpx2.Client) -> None:
    """`tool_rounds`: a tool_use after the user's text and after the results of fewer rounds than that,
    thinking before each (thinking on), then text; `tool_name` picks among the request's tools,
    `tool_arguments` are its input."""
    fake.state.configure(tool_rounds=3, tool_name="fetch", tool_arguments='{"url": "https://example.com"}')
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "go"}]}]
    kinds = []
    for _ in range(5):
        answer = http.post(PATH, json=body(messages=messages, tools=TOOLS)).json()
        kinds.append([b["type"] for b in answer["content"]])
        messages.append({"role": "assistant", "content": answer["content"]})
        uses = [b for b in answer["content"] if b["type"] == "tool_use"]
        if not uses:
            break
        assert (uses[0]["name"], uses[0]["input"]) == ("fetch", {"url": "https://example.com"})
        messages.append({"role": "user", "content": [tool_result(uses[0]["id"])]})
    assert kinds == [["thinking", "tool_use"]] * 3 + [["thinking", "text"]]
    messages.append({"role": "user", "content": "again"})  # a new user turn starts the count again
    again = http.post(PATH, json=body(messages=messages, tools=TOOLS)).json()
    assert [b["type"] for b in again["content"]] == ["thinking", "tool_use"]
