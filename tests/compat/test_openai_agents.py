"""openai-agents on its chat-completions model (`OpenAIChatCompletionsModel` + `AsyncOpenAI` pointed at
chatgate), tracing off.

The SDK sends `strict: true` on every function tool. DeepSeek enforces strict schemas only on `/beta` and
accepts (ignores) the flag on its default base URL (R32, docs/rules-chat.md U11), so the client works on
chatgate's `/v1` as it does on DeepSeek's: chatgate forwards the flag unchanged with an `x-chatgate-warning`.
The SDK keeps DeepSeek's `reasoning_content` and sends it back with the tool call, so the thinking-mode tool
loop works as is (R17).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import pytest
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    RawResponsesStreamEvent,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from tests.compat.conftest import CLIENT_KEY, MODEL, Gate
from tests.compat.conftest import search_forecast as forecast


@function_tool
def search_forecast(q: str) -> str:
    """Search the weather forecast."""
    return forecast(q)


@pytest.fixture(autouse=True)
def no_tracing() -> Iterator[None]:
    set_tracing_disabled(True)  # nothing may leave this machine
    yield


def agent(gate: Gate, route: str = "/v1") -> tuple[Agent[Any], openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(base_url=gate.url + route, api_key=CLIENT_KEY, max_retries=0, timeout=10)
    model = OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
    forecaster = Agent(name="forecaster", instructions="Answer in one line.", tools=[search_forecast],
                       model=model)
    return forecaster, client


def run(gate: Gate, prompt: Any, route: str = "/v1") -> Any:
    async def go() -> Any:
        a, client = agent(gate, route)
        async with client:
            return await Runner.run(a, prompt)
    return asyncio.run(go())


def test_agents_tool_loop_passes_reasoning_content_back_R17(gate: Gate) -> None:
    result = run(gate, "Do I need an umbrella in Lisbon today?")
    assert result.final_output == "Answer 4: the tool said forecast for x: light rain"
    first, second = gate.upstream_bodies()
    assert first["tools"][0]["function"]["strict"] is True
    assistant = second["messages"][2]
    assert assistant["tool_calls"][0]["function"] == {"name": "search_forecast", "arguments": '{"q": "x"}'}
    assert assistant["reasoning_content"] == "The user sent 2 messages; I will answer."
    assert second["messages"][3]["content"] == "forecast for x: light rain"


def test_agents_streamed_run_arrives_in_chunks(gate: Gate) -> None:
    async def go() -> tuple[list[str], Any]:
        a, client = agent(gate)
        a = a.clone(tools=[])
        async with client:
            streamed = Runner.run_streamed(a, "Do I need an umbrella in Lisbon today?")
            deltas = [e.data.delta async for e in streamed.stream_events()
                      if isinstance(e, RawResponsesStreamEvent)
                      and e.data.type == "response.output_text.delta"]
            return deltas, streamed.final_output

    deltas, final = asyncio.run(go())
    assert len(deltas) > 3 and "".join(deltas) == final == "Answer 2: the fake DeepSeek says hello."
    assert gate.upstream_bodies()[0]["stream"] is True


def test_agents_broken_history_raises_bad_request_error_R17(gate: Gate) -> None:
    """A replayed history whose tool call lost its reasoning: chatgate's 400 surfaces as BadRequestError."""
    history = [
        {"role": "user", "content": "Do I need an umbrella in Lisbon today?"},
        {"type": "function_call", "call_id": "call_0", "name": "search_forecast", "arguments": '{"q": "x"}'},
        {"type": "function_call_output", "call_id": "call_0", "output": "forecast for x: light rain"},
    ]
    with pytest.raises(openai.BadRequestError) as info:
        run(gate, history)
    assert info.value.status_code == 400 and info.value.code == "reasoning_content_missing"
    body: Any = info.value.body
    assert body["problems"][0]["rule"] == "R17"
    assert gate.upstream_bodies() == []


def test_agents_strict_tools_on_v1_are_forwarded_unchanged_with_a_warning(gate: Gate) -> None:
    """DeepSeek's default base URL accepts `strict: true` (it is enforced on /beta only): no false alarm."""
    result = run(gate, "Do I need an umbrella in Lisbon today?", route="/v1")
    assert result.final_output == "Answer 4: the tool said forecast for x: light rain"
    first = gate.upstream_bodies()[0]
    assert first["tools"][0]["function"]["strict"] is True
    replay = httpx2.post(gate.url + "/v1/chat/completions", json=first,
                         headers={"authorization": f"Bearer {CLIENT_KEY}"}, timeout=10)
    assert replay.status_code == 200
    warning = replay.headers["x-chatgate-warning"]
    assert "only enforced on DeepSeek's /beta" in warning and gate.url + "/beta" in warning


def test_agents_strict_tools_on_beta_have_their_schemas_checked(gate: Gate) -> None:
    result = run(gate, "Do I need an umbrella in Lisbon today?", route="/beta")
    assert result.final_output == "Answer 4: the tool said forecast for x: light rain"
    assert all(r.path == "/beta/chat/completions" for r in gate.fake.requests)
