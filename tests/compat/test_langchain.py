"""LangChain `ChatOpenAI` with tools through a real chatgate.

ChatOpenAI drops DeepSeek's `reasoning_content` (it is not sent back with the AIMessage), so a thinking-mode
tool loop breaks R17: DeepSeek refuses it (the control, straight against the fake). Through chatgate the
same three-round loop completes: restore_reasoning puts back what chatgate relayed to the same key. A history
chatgate never relayed cannot be restored: the local 400, raised by LangChain as `openai.BadRequestError`.
Without thinking (`extra_body={"thinking": {"type": "disabled"}}`) the loop works as is.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from tests.compat.conftest import CLIENT_KEY, MODEL, Gate
from tests.compat.conftest import search_forecast as forecast

NO_THINKING = {"thinking": {"type": "disabled"}}


@tool
def search_forecast(q: str) -> str:
    """Search the weather forecast."""
    return forecast(q)


def chat(gate: Gate, **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(model=MODEL, base_url=gate.base_url, api_key=CLIENT_KEY,  # type: ignore[arg-type]
                      max_retries=0, timeout=10, **kwargs)


def run_tool_loop(llm: ChatOpenAI) -> tuple[AIMessage, AIMessage]:
    bound = llm.bind_tools([search_forecast])
    messages: list[BaseMessage] = [HumanMessage("Do I need an umbrella in Lisbon today?")]
    first = bound.invoke(messages)
    assert isinstance(first, AIMessage)
    messages.append(first)
    for call in first.tool_calls:
        messages.append(ToolMessage(search_forecast.invoke(call["args"]), tool_call_id=call["id"]))
    final = bound.invoke(messages)
    assert isinstance(final, AIMessage)
    return first, final


def test_langchain_tool_loop_with_thinking_disabled(gate: Gate) -> None:
    first, final = run_tool_loop(chat(gate, extra_body=NO_THINKING))
    assert first.tool_calls[0]["name"] == "search_forecast" and first.tool_calls[0]["args"] == {"q": "x"}
    assert final.content == "Answer 3: the tool said forecast for x: light rain"
    bodies = gate.upstream_bodies()
    assert [b["thinking"] for b in bodies] == [NO_THINKING["thinking"]] * 2
    assert bodies[1]["messages"][2] == {"role": "tool", "tool_call_id": first.tool_calls[0]["id"],
                                        "content": "forecast for x: light rain"}


def test_langchain_streamed_answer_arrives_in_chunks(gate: Gate) -> None:
    chunks = list(chat(gate, extra_body=NO_THINKING).stream("Do I need an umbrella in Lisbon today?"))
    text = "".join(str(c.content) for c in chunks)
    assert len([c for c in chunks if c.content]) > 3
    assert text == "Answer 1: the fake DeepSeek says hello."
    assert gate.upstream_bodies()[0]["stream"] is True


def test_langchain_history_without_reasoning_content_is_refused_locally_R17(gate: Gate) -> None:
    """A saved conversation replayed in thinking mode: the tool call's reasoning_content is gone and chatgate
    never relayed that call, so nothing can put it back."""
    messages: list[BaseMessage] = [
        HumanMessage("Do I need an umbrella in Lisbon today?"),
        AIMessage("", tool_calls=[{"name": "search_forecast", "args": {"q": "x"}, "id": "call_0"}]),
        ToolMessage("forecast for x: light rain", tool_call_id="call_0"),
    ]
    with pytest.raises(openai.BadRequestError) as info:
        chat(gate).bind_tools([search_forecast]).invoke(messages)  # thinking on (the model's default)
    assert info.value.status_code == 400 and info.value.code == "reasoning_content_missing"
    body: Any = info.value.body
    assert body["problems"][0]["rule"] == "R17" and body["param"] == "messages[1].reasoning_content"
    assert gate.upstream_bodies() == []  # nothing reached DeepSeek


def three_rounds(llm: ChatOpenAI, stream: bool) -> list[AIMessage]:
    """An agent: three user questions, each answered through a tool call; LangChain keeps the history (and,
    like every ChatOpenAI loop, drops reasoning_content from the AIMessages it sends back)."""
    bound = llm.bind_tools([search_forecast])
    messages: list[BaseMessage] = []
    finals: list[AIMessage] = []
    for question in ("Umbrella in Lisbon today?", "And in Porto?", "And in Faro?"):
        messages.append(HumanMessage(question))
        for _ in range(2):  # the tool call, then the answer
            if stream:
                reply: Any = None
                for chunk in bound.stream(messages):
                    reply = chunk if reply is None else reply + chunk
            else:
                reply = bound.invoke(messages)
            message = AIMessage(content=reply.content, tool_calls=reply.tool_calls)
            messages.append(message)
            for call in message.tool_calls:
                messages.append(ToolMessage(search_forecast.invoke(call["args"]), tool_call_id=call["id"]))
            if not message.tool_calls:
                finals.append(message)
                break
    return finals


@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "stream"])
def test_langchain_three_round_thinking_loop_completes_with_restored_reasoning(gate: Gate,
                                                                              stream: bool) -> None:
    """Issue 12: the loop DeepSeek refuses (R17) completes through chatgate, which puts back the
    reasoning_content of each tool-call turn it relayed to this key."""
    start = len(gate.recorder.exchanges)
    finals = three_rounds(chat(gate), stream)
    assert [f.content for f in finals] == [f"Answer {n}: the tool said forecast for x: light rain"
                                           for n in (3, 7, 11)]
    bodies = gate.upstream_bodies()
    assert len(bodies) == 6
    last = bodies[-1]["messages"]
    turns = [m for m in last if m["role"] == "assistant" and m.get("tool_calls")]
    assert len(turns) == 3 and all(m["reasoning_content"].startswith("The user sent") for m in turns)
    sent = [json.loads(x.body) for x in gate.recorder.exchanges[start:]]
    assert len(sent) == 6
    assert not any("reasoning_content" in m for body in sent for m in body["messages"]), "LangChain drops it"
    repaired = [x.response_headers.get("x-chatgate-repaired", "") for x in gate.recorder.exchanges[start:]]
    assert repaired[0] == "" and all(r.startswith("restore_reasoning@messages[1]") for r in repaired[1:])


@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "stream"])
def test_langchain_three_round_thinking_loop_fails_straight_against_deepseek_R17(gate: Gate,
                                                                                 stream: bool) -> None:
    """The control: the same loop sent straight to the (fake) DeepSeek gets DeepSeek's own 400."""
    direct = ChatOpenAI(model=MODEL, base_url=gate.fake_url, api_key=CLIENT_KEY,  # type: ignore[arg-type]
                        max_retries=0, timeout=10)
    with pytest.raises(openai.BadRequestError) as info:
        three_rounds(direct, stream)
    assert "The `reasoning_content` in the thinking mode must be passed back to the API." in str(info.value)
