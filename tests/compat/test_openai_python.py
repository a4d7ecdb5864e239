"""openai-python (sync `OpenAI` and async `AsyncOpenAI`) through a real chatgate to the fake DeepSeek."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest

from tests.compat.conftest import CLIENT_KEY, MODEL, SEARCH_TOOL, Gate, search_forecast

QUESTION = {"role": "user", "content": "Do I need an umbrella in Lisbon today?"}


def assistant_turn(message: Any) -> dict[str, Any]:
    """The assistant message to send back, reasoning_content included (R17: thinking + tool_calls)."""
    turn: dict[str, Any] = message.model_dump(exclude_none=True)
    assert turn.get("reasoning_content"), "DeepSeek's reasoning_content must reach the client"
    return turn


def tool_results(message: Any) -> list[dict[str, Any]]:
    return [{"role": "tool", "tool_call_id": call.id,
             "content": search_forecast(**json.loads(call.function.arguments))}
            for call in message.tool_calls]


BROKEN_HISTORY: list[dict[str, Any]] = [
    QUESTION,
    # The assistant's tool call came back without its reasoning_content: refused in thinking mode (R17).
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function",
         "function": {"name": "search_forecast", "arguments": '{"q": "x"}'}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "18C"},
]


def check_refusal(exc: openai.BadRequestError, gate: Gate) -> None:
    assert exc.status_code == 400
    assert exc.code == "reasoning_content_missing"
    body: Any = exc.body
    problem = body["problems"][0]
    assert problem["rule"] == "R17" and problem["param"] == "messages[1].reasoning_content"
    assert gate.upstream_bodies() == []  # refused locally, DeepSeek never saw it


# --- sync ---------------------------------------------------------------------------------------


@pytest.fixture
def client(gate: Gate) -> Any:
    with openai.OpenAI(base_url=gate.base_url, api_key=CLIENT_KEY, max_retries=0, timeout=10) as c:
        yield c


def test_sync_tool_loop_passes_reasoning_content_back_R17(client: openai.OpenAI, gate: Gate) -> None:
    messages: list[Any] = [QUESTION]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[SEARCH_TOOL])
    assert first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "search_forecast"
    messages += [assistant_turn(first.choices[0].message), *tool_results(first.choices[0].message)]
    final = client.chat.completions.create(model=MODEL, messages=messages, tools=[SEARCH_TOOL])
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content.endswith("the tool said forecast for x: light rain")
    sent = gate.upstream_bodies()[-1]["messages"][1]
    assert sent["reasoning_content"] == first.choices[0].message.reasoning_content  # type: ignore[attr-defined]


def test_sync_streamed_answer_arrives_in_chunks(client: openai.OpenAI, gate: Gate) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=[QUESTION], stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or ""
                        for c in chunks if c.choices)
    assert len(chunks) > 3 and text.startswith("Answer 1") and reasoning
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_sync_broken_history_raises_bad_request_error_R17(client: openai.OpenAI, gate: Gate) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=BROKEN_HISTORY, tools=[SEARCH_TOOL])
    check_refusal(info.value, gate)


# --- async --------------------------------------------------------------------------------------


def test_async_tool_loop_passes_reasoning_content_back_R17(gate: Gate) -> None:
    async def run() -> str:
        async with openai.AsyncOpenAI(base_url=gate.base_url, api_key=CLIENT_KEY, max_retries=0) as client:
            messages: list[Any] = [QUESTION]
            first = await client.chat.completions.create(model=MODEL, messages=messages, tools=[SEARCH_TOOL])
            messages += [assistant_turn(first.choices[0].message), *tool_results(first.choices[0].message)]
            final = await client.chat.completions.create(model=MODEL, messages=messages, tools=[SEARCH_TOOL])
            return final.choices[0].message.content or ""

    assert asyncio.run(run()).endswith("the tool said forecast for x: light rain")
    assert gate.upstream_bodies()[1]["messages"][1]["reasoning_content"]


def test_async_streamed_answers_run_concurrently(gate: Gate) -> None:
    async def one(client: openai.AsyncOpenAI, n: int) -> str:
        stream = await client.chat.completions.create(
            model=MODEL, stream=True, messages=[{"role": "user", "content": f"Count to {n}."}])
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    async def run() -> list[str]:
        async with openai.AsyncOpenAI(base_url=gate.base_url, api_key=CLIENT_KEY, max_retries=0) as client:
            return await asyncio.gather(*(one(client, n) for n in range(4)))

    answers = asyncio.run(run())
    assert answers == ["Answer 1: the fake DeepSeek says hello."] * 4


def test_async_broken_history_raises_bad_request_error_R17(gate: Gate) -> None:
    async def run() -> None:
        async with openai.AsyncOpenAI(base_url=gate.base_url, api_key=CLIENT_KEY, max_retries=0) as client:
            await client.chat.completions.create(model=MODEL, messages=BROKEN_HISTORY, tools=[SEARCH_TOOL])

    with pytest.raises(openai.BadRequestError) as info:
        asyncio.run(run())
    check_refusal(info.value, gate)
