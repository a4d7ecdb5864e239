"""End to end with the real openai SDK: SDK -> chatgate (uvicorn, loopback) -> fake DeepSeek.

Valid requests must arrive at the fake byte for byte as the SDK sent them; invalid ones must raise
`openai.BadRequestError` locally and never reach the fake.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest

from chatgate.gateway.auth import new_key
from tests.fakes.server import RunningFake
from tests.gateway.conftest import usage_rows
from tests.harness import RunningChatgate

WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


class Sent:
    """Captures the bytes the SDK put on the wire (an httpx2 request event hook)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def hook(self, request: httpx2.Request) -> None:
        if request.url.path.endswith("/chat/completions"):
            self.bodies.append(request.read())

    async def ahook(self, request: httpx2.Request) -> None:
        self.hook(request)


@pytest.fixture
def sent() -> Sent:
    return Sent()


@pytest.fixture(params=["v1", "root"])
def base_url(request: pytest.FixtureRequest, gate: RunningChatgate) -> str:
    """Both styles users configure: `http://host:port/v1` and `http://host:port`."""
    return f"{gate.url}/v1" if request.param == "v1" else gate.url


@pytest.fixture
def sdk(base_url: str, sent: Sent) -> Iterator[openai.OpenAI]:
    http = httpx2.Client(event_hooks={"request": [sent.hook]}, timeout=20)
    with openai.OpenAI(base_url=base_url, api_key="sk-e2e-client-key", max_retries=0, http_client=http) as c:
        yield c


def make_async(base_url: str, sent: Sent) -> openai.AsyncOpenAI:
    http = httpx2.AsyncClient(event_hooks={"request": [sent.ahook]}, timeout=20)
    return openai.AsyncOpenAI(base_url=base_url, api_key="sk-e2e-client-key", max_retries=0, http_client=http)


def assert_forwarded_verbatim(fake: RunningFake, sent: Sent) -> None:
    assert fake.state.wait_idle(5)
    assert [r.body for r in fake.state.requests] == sent.bodies
    assert sent.bodies, "the SDK sent nothing"


# ------------------------------------------------------------------------------------------- happy paths


def test_sync_chat_completion(sdk: openai.OpenAI, fake: RunningFake, sent: Sent, base_url: str) -> None:
    reply = sdk.chat.completions.create(
        model="deepseek-flash",
        messages=[{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": "What is the capital of France?"}],
    )
    assert reply.choices[0].message.content == "Answer 2: the fake DeepSeek says hello."
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    assert fake.state.requests[0].path == "/chat/completions"
    assert_forwarded_verbatim(fake, sent)


def test_sync_streaming(sdk: openai.OpenAI, fake: RunningFake, sent: Sent, base_url: str) -> None:
    stream = sdk.chat.completions.create(
        model="deepseek-flash", stream=True,
        messages=[{"role": "user", "content": "Say hello"}],
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Answer 1: the fake DeepSeek says hello."
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert_forwarded_verbatim(fake, sent)


def test_async_client_plain_and_streaming(fake: RunningFake, sent: Sent, base_url: str) -> None:
    async def conversation() -> tuple[str | None, str]:
        async with make_async(base_url, sent) as client:
            reply = await client.chat.completions.create(
                model="deepseek-flash", messages=[{"role": "user", "content": "Name a colour"}])
            stream = await client.chat.completions.create(
                model="deepseek-flash", stream=True, messages=[{"role": "user", "content": "Name a fruit"}])
            streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            return reply.choices[0].message.content, streamed

    plain, streamed = asyncio.run(conversation())
    assert plain == streamed == "Answer 1: the fake DeepSeek says hello."
    assert_forwarded_verbatim(fake, sent)


def test_thinking_disabled_via_extra_body(sdk: openai.OpenAI, fake: RunningFake, sent: Sent,
                                          base_url: str) -> None:
    reply = sdk.chat.completions.create(
        model="deepseek-flash", messages=[{"role": "user", "content": "Quick answer please"}],
        temperature=0.3, extra_body={"thinking": {"type": "disabled"}},
    )
    message = reply.choices[0].message
    assert getattr(message, "reasoning_content", None) is None
    assert fake.state.requests[0].json["thinking"] == {"type": "disabled"}
    assert_forwarded_verbatim(fake, sent)


def test_tool_calling_loop_with_reasoning_passed_back(sdk: openai.OpenAI, fake: RunningFake, sent: Sent,
                                                      base_url: str) -> None:
    """user -> tool call -> tool result (reasoning_content passed back, R17) -> final answer."""
    messages: list[Any] = [{"role": "user", "content": "What's the weather in Paris?"}]
    first = sdk.chat.completions.create(model="deepseek-flash", messages=messages, tools=[WEATHER_TOOL])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "get_weather"
    reasoning = getattr(choice.message, "reasoning_content", None)
    assert isinstance(reasoning, str) and reasoning
    messages.append({
        "role": "assistant", "content": choice.message.content or "", "reasoning_content": reasoning,
        "tool_calls": [{"id": call.id, "type": "function",
                        "function": {"name": call.function.name, "arguments": call.function.arguments}}],
    })
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 18})})
    final = sdk.chat.completions.create(model="deepseek-flash", messages=messages, tools=[WEATHER_TOOL])
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content == 'Answer 3: the tool said {"temp_c": 18}'
    assert len(fake.state.requests) == 2
    assert_forwarded_verbatim(fake, sent)


def test_streamed_tool_call(sdk: openai.OpenAI, fake: RunningFake, sent: Sent, base_url: str) -> None:
    stream = sdk.chat.completions.create(
        model="deepseek-flash", stream=True, tools=[WEATHER_TOOL],
        messages=[{"role": "user", "content": "Weather in Lyon?"}],
    )
    arguments = ""
    for chunk in stream:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                arguments += call.function.arguments or "" if call.function else ""
    assert json.loads(arguments) == {"q": "x"}
    assert_forwarded_verbatim(fake, sent)


def test_usage_is_metered_per_request(sdk: openai.OpenAI, fake: RunningFake, tmp_path: Path,
                                      base_url: str) -> None:
    reply = sdk.chat.completions.create(model="deepseek-flash", messages=[{"role": "user", "content": "Hi"}])
    (row,) = usage_rows(tmp_path, 1)
    assert reply.usage is not None
    assert (row["outcome"], row["upstream_status"], row["model"]) == ("ok", 200, "deepseek-flash")
    assert row["prompt_tokens"] == reply.usage.prompt_tokens
    assert row["completion_tokens"] == reply.usage.completion_tokens
    assert row["tokens_exact"] == 1
    assert row["key_id"].startswith("fp-") and "sk-e2e" not in row["key_id"]


# ------------------------------------------------------------------------------------------- rejections


INVALID_CASES: list[Any] = [
    pytest.param(
        {"messages": [{"role": "user", "content": "Weather?"},
                      {"role": "tool", "tool_call_id": "call_nope", "content": "18C"}]},
        "messages[1].role", "tool_without_tool_calls", id="R14-tool-result-without-call"),
    pytest.param(
        {"messages": [{"role": "user", "content": "hi"}], "temperature": 2.5,
         "extra_body": {"thinking": {"type": "disabled"}}},
        "temperature", "out_of_range", id="R25-temperature"),
    pytest.param(
        {"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n", "n_not_supported", id="R38-n"),
    pytest.param(
        {"messages": [{"role": "user", "content": "hi"}], "stream_options": {"include_usage": True}},
        "stream_options", "stream_options_without_stream", id="R29-stream-options-without-stream"),
    pytest.param(
        {"messages": [{"role": "user", "content": "What's the weather?"},
                      {"role": "assistant", "content": "", "tool_calls": [
                          {"id": "call_1", "type": "function",
                           "function": {"name": "get_weather", "arguments": "{}"}}]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "18C"}],
         "tools": [WEATHER_TOOL]},
        "messages[1].reasoning_content", "reasoning_content_missing", id="R17-reasoning-not-passed-back"),
]


@pytest.mark.parametrize(("kwargs", "param", "code"), INVALID_CASES)
def test_invalid_payload_raises_bad_request_and_never_reaches_deepseek(
        sdk: openai.OpenAI, fake: RunningFake, kwargs: dict[str, Any], param: str, code: str, base_url: str,
        tmp_path: Path) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model="deepseek-flash", **kwargs)
    error = caught.value
    assert error.status_code == 400
    assert (error.param, error.code) == (param, code)
    body: Any = error.body
    assert (body["problems"][0]["param"], body["problems"][0]["code"]) == (param, code)
    assert fake.state.requests == []
    (row,) = usage_rows(tmp_path, 1)
    assert (row["outcome"], row["rule_code"], row["prompt_tokens"]) == ("rejected", error.code, 0)


def test_async_client_rejection(fake: RunningFake, sent: Sent, base_url: str) -> None:
    async def call() -> None:
        async with make_async(base_url, sent) as client:
            await client.chat.completions.create(
                model="deepseek-flash", messages=[{"role": "user", "content": "hi"}], n=3)

    with pytest.raises(openai.BadRequestError) as caught:
        asyncio.run(call())
    assert (caught.value.param, caught.value.code) == ("n", "n_not_supported")
    assert fake.state.requests == []


def test_validate_endpoint_agrees_with_forwarding(gate: RunningChatgate, fake: RunningFake,
                                                  sdk: openai.OpenAI, sent: Sent, base_url: str) -> None:
    """The bytes the SDK sends validate as-is on the dry-run route, and arrive unchanged upstream."""
    sdk.chat.completions.create(model="deepseek-flash", messages=[{"role": "user", "content": "ping"}],
                                max_tokens=5, extra_body={"x_team_tag": "alpha"})
    check = httpx2.post(gate.url + "/v1/chat/completions/validate", content=sent.bodies[0],
                        headers={"content-type": "application/json"}, timeout=10)
    assert check.status_code == 200 and check.json()["valid"] is True
    assert_forwarded_verbatim(fake, sent)
    assert fake.state.requests[0].json["x_team_tag"] == "alpha"


def test_managed_key_end_to_end(start_gate: Callable[..., RunningChatgate], fake: RunningFake,
                                tmp_path: Path) -> None:
    gate = start_gate(auth={"mode": "managed", "upstream_api_key": "sk-house-deepseek-key"})
    key_id, secret, key_hash, prefix = new_key()
    gate.state.store.create_key(key_id, key_hash, prefix, "search", "ranker-service")
    with openai.OpenAI(base_url=gate.url + "/v1", api_key=secret, max_retries=0) as client:
        client.chat.completions.create(model="deepseek-flash", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.AuthenticationError):
            client.with_options(api_key="cg-revoked-or-unknown").chat.completions.create(
                model="deepseek-flash", messages=[{"role": "user", "content": "hi"}])
    assert [r.auth_key for r in fake.state.requests] == ["sk-house-deepseek-key"]
    (row,) = usage_rows(tmp_path, 1)
    assert (row["key_id"], row["team"], row["outcome"]) == (key_id, "search", "ok")


def test_queued_request_keepalive_lines_before_the_json_body(sdk: openai.OpenAI, fake: RunningFake,
                                                             tmp_path: Path, base_url: str) -> None:
    """DeepSeek sends empty lines while a non-streaming request waits in its queue
    (docs/rules-chat.md#deepseeks-answers): still one answer, metered exactly."""
    fake.state.configure(nonstream_keepalive_lines=3, chunk_delay=0.02)
    reply = sdk.chat.completions.create(model="deepseek-flash", messages=[{"role": "user", "content": "Hi"}])
    assert reply.choices[0].message.content == "Answer 1: the fake DeepSeek says hello."
    (row,) = usage_rows(tmp_path, 1)
    assert (row["outcome"], row["tokens_exact"]) == ("ok", 1)


def test_non_ascii_header_reaches_deepseek_over_the_real_transport(gate: RunningChatgate,
                                                                   fake: RunningFake) -> None:
    headers = {b"content-type": b"application/json", b"authorization": b"Bearer sk-e2e",
               b"x-team-label": "caf\u00e9".encode("latin-1")}
    body = b'{"model": "deepseek-flash", "messages": [{"role": "user", "content": "hi"}]}'
    response = httpx2.post(gate.url + "/v1/chat/completions", content=body, headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    # The aiohttp transport re-encodes header text as UTF-8 (0xE9 -> 0xC3 0xA9): same text, other bytes.
    sent = fake.state.requests[0].headers["x-team-label"].encode("latin-1")
    assert sent in ("caf\u00e9".encode("latin-1"), "caf\u00e9".encode())
