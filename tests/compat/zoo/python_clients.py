"""The zoo's in-process drivers: each runs one scenario with a Python client library, written the way that
library's docs show a tool loop, and returns the final answer or the error the library raised."""

from __future__ import annotations

import asyncio
import json
import os
import traceback
from collections.abc import Callable, Iterable
from functools import reduce
from operator import add
from typing import Any

# LiteLLM fetches its model cost map from GitHub at import time unless told not to (seconds of retries
# offline, a hang where DNS hangs); it must be set before litellm is first imported.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm
import openai
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import StructuredTool
from langchain_deepseek import ChatDeepSeek
from langchain_openai import ChatOpenAI
from langchain_openai.chat_models.base import BaseChatOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import PromptedOutput, Tool
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.deepseek import DeepSeekProvider
from pydantic_ai.providers.openai import OpenAIProvider

from tests.compat.zoo.model import (
    HANDOFF,
    NO_THINKING,
    STRUCTURED,
    STRUCTURED_TOOL,
    TOOL_DESCRIPTION,
    TOOL_NAME,
    TOOL_SCHEMA,
    TOOLS,
    Outcome,
    Scenario,
    forecast,
)

Driver = Callable[[Scenario, str, str], Outcome]
OPENAI_TOOLS: Any = [TOOL_SCHEMA]  # a plain dict, as users write it (the SDK's TypedDicts accept it)
TIMEOUT = 10.0

set_tracing_disabled(True)  # openai-agents: no traces leave the machine
litellm.telemetry = False
litellm.suppress_debug_info = True  # no "Provider List: https://docs.litellm.ai/…" banners
litellm.success_callback, litellm.failure_callback, litellm.callbacks = [], [], []


class Verdict(BaseModel):
    """JSON answer after a tool round: the fake answers {"answer": "Answer N", "ok": true} in JSON mode."""

    answer: str
    ok: bool


class Forecast(BaseModel):
    """Structured output through the output tool: the fake calls it with {"q": "x"}."""

    q: str


def search_forecast(q: str) -> str:
    """Search the weather forecast."""
    return forecast(q)


def run(driver: Driver, scenario: Scenario, base_url: str, api_key: str) -> Outcome:
    """Run a driver; an exception becomes an Outcome carrying its HTTP status (if any) and text."""
    try:
        return driver(scenario, base_url, api_key)
    except Exception as exc:  # the clients raise their own types; the status is what matters
        status = getattr(exc, "status_code", None) or getattr(exc, "status", None)
        text = "".join(traceback.format_exception_only(exc)).strip()
        if not isinstance(status, int):
            text += "\n" + traceback.format_exc()
        return Outcome(status=status if isinstance(status, int) else None, error=text[:4000])


def tool_results(calls: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": "tool", "tool_call_id": call["id"],
             "content": forecast(**json.loads(call["function"]["arguments"]))} for call in calls]


# --- openai-python --------------------------------------------------------------------------------------


def accumulate(chunks: Iterable[Any]) -> dict[str, Any]:
    """The assistant message of a streamed answer, put together as DeepSeek's thinking-mode guide does:
    content, reasoning_content and the tool calls by index."""
    content, reasoning = "", None
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        piece = getattr(delta, "reasoning_content", None)
        if piece is not None:
            reasoning = (reasoning or "") + piece
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"id": "", "type": "function",
                                                  "function": {"name": "", "arguments": ""}})
            entry["id"] = call.id or entry["id"]
            if call.function is not None:
                entry["function"]["name"] += call.function.name or ""
                entry["function"]["arguments"] += call.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [calls[index] for index in sorted(calls)]
    return message


def openai_sync(s: Scenario, base_url: str, api_key: str) -> Outcome:
    extra = None if s.thinking else NO_THINKING
    with openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=TIMEOUT) as client:
        messages: list[Any] = [{"role": "user", "content": s.prompt}]
        while True:
            if s.stream:
                message = accumulate(client.chat.completions.create(
                    model=s.model, messages=messages, tools=OPENAI_TOOLS, stream=True, extra_body=extra))
            else:
                answer = client.chat.completions.create(model=s.model, messages=messages, tools=OPENAI_TOOLS,
                                                        extra_body=extra)
                message = answer.choices[0].message.model_dump(exclude_none=True)
            if not message.get("tool_calls"):
                return Outcome(text=message["content"])
            messages += [message, *tool_results(message["tool_calls"])]


async def openai_async(s: Scenario, base_url: str, api_key: str) -> Outcome:
    extra = None if s.thinking else NO_THINKING
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=TIMEOUT)
    async with client:
        messages: list[Any] = [{"role": "user", "content": s.prompt}]
        while True:
            if s.stream:
                async with client.chat.completions.stream(
                        model=s.model, messages=messages, tools=OPENAI_TOOLS, extra_body=extra) as stream:
                    completion = await stream.get_final_completion()
                message: Any = completion.choices[0].message
            else:
                answer = await client.chat.completions.create(model=s.model, messages=messages,
                                                              tools=OPENAI_TOOLS, extra_body=extra)
                message = answer.choices[0].message
            if not message.tool_calls:
                return Outcome(text=message.content)
            turn = message.model_dump(exclude_none=True)
            messages += [turn, *tool_results(turn["tool_calls"])]


# --- openai-agents --------------------------------------------------------------------------------------


@function_tool(name_override=TOOL_NAME, description_override=TOOL_DESCRIPTION)
def agents_search_forecast(q: str) -> str:
    return forecast(q)


async def openai_agents(s: Scenario, base_url: str, api_key: str) -> Outcome:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=TIMEOUT)
    model = OpenAIChatCompletionsModel(model=s.model, openai_client=client)
    settings = ModelSettings() if s.thinking else ModelSettings(extra_body=NO_THINKING)
    forecaster = Agent(name="forecaster", instructions="Answer in one line.", tools=[agents_search_forecast],
                       model=model, model_settings=settings)
    agent: Agent[Any] = forecaster
    if s.kind == HANDOFF:
        agent = Agent(name="triage", instructions="Hand weather questions to the forecaster.",
                      handoffs=[forecaster], model=model, model_settings=settings)
    elif s.kind == STRUCTURED:
        agent = forecaster.clone(instructions="Answer in JSON.", output_type=Verdict)
    async with client:
        if s.stream:
            streamed = Runner.run_streamed(agent, s.prompt)
            async for _ in streamed.stream_events():
                pass
            output, last = streamed.final_output, streamed.last_agent
        else:
            result = await Runner.run(agent, s.prompt)
            output, last = result.final_output, result.last_agent
    if isinstance(output, BaseModel):
        return Outcome(output=output.model_dump(), text=last.name)
    return Outcome(text=str(output), output={"last_agent": last.name})


# --- pydantic-ai ----------------------------------------------------------------------------------------


async def pydantic_ai(s: Scenario, base_url: str, api_key: str, deepseek_provider: bool = False) -> Outcome:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=TIMEOUT)
    if deepseek_provider:
        model = OpenAIChatModel(s.model, provider=DeepSeekProvider(openai_client=client))
        settings: Any = {} if s.thinking else {"thinking": False}  # pydantic-ai's own switch
    else:
        model = OpenAIChatModel(s.model, provider=OpenAIProvider(openai_client=client))
        settings = {} if s.thinking else {"extra_body": NO_THINKING}
    output_type: Any = {TOOLS: str, STRUCTURED: PromptedOutput(Verdict), STRUCTURED_TOOL: Forecast}[s.kind]
    tools = [] if s.kind == STRUCTURED_TOOL else [Tool(search_forecast, name=TOOL_NAME, takes_ctx=False)]
    agent = PydanticAgent(model, output_type=output_type, tools=tools, model_settings=settings, retries=0)
    async with client:
        if s.stream:
            async with agent.run_stream(s.prompt) as streamed:
                output = await streamed.get_output()
        else:
            output = (await agent.run(s.prompt)).output
    return Outcome(output=output.model_dump()) if isinstance(output, BaseModel) else Outcome(text=output)


# --- LangChain ------------------------------------------------------------------------------------------


langchain_search_forecast = StructuredTool.from_function(search_forecast, name=TOOL_NAME,
                                                         description=TOOL_DESCRIPTION)


def langchain(s: Scenario, base_url: str, api_key: str, deepseek: bool = False) -> Outcome:
    extra: dict[str, Any] = {} if s.thinking else {"extra_body": NO_THINKING}
    llm: BaseChatOpenAI
    if deepseek:
        llm = ChatDeepSeek(model=s.model, api_base=base_url, api_key=api_key,  # type: ignore[call-arg,arg-type]
                           max_retries=0, timeout=TIMEOUT, streaming=s.stream, **extra)
    else:
        llm = ChatOpenAI(model=s.model, base_url=base_url, api_key=api_key,  # type: ignore[arg-type]
                         max_retries=0, timeout=TIMEOUT, streaming=s.stream, **extra)
    bound = llm.bind_tools([langchain_search_forecast])
    messages: list[BaseMessage] = [HumanMessage(s.prompt)]
    while True:
        answer = reduce(add, bound.stream(messages)) if s.stream else bound.invoke(messages)
        assert isinstance(answer, AIMessage)
        if not answer.tool_calls:
            return Outcome(text=str(answer.content))
        messages.append(answer)
        for call in answer.tool_calls:
            result = langchain_search_forecast.invoke(call["args"])
            messages.append(ToolMessage(result, tool_call_id=call["id"]))


# --- LiteLLM --------------------------------------------------------------------------------------------


def litellm_client(s: Scenario, base_url: str, api_key: str, provider: str) -> Outcome:
    extra: dict[str, Any] = {} if s.thinking else {"extra_body": NO_THINKING}
    messages: list[Any] = [{"role": "user", "content": s.prompt}]
    while True:
        answer: Any = litellm.completion(model=f"{provider}/{s.model}", api_base=base_url, api_key=api_key,
                                         messages=messages, tools=OPENAI_TOOLS, stream=s.stream,
                                         num_retries=0, timeout=TIMEOUT, **extra)
        if s.stream:
            answer = litellm.stream_chunk_builder(list(answer), messages=messages)
        message = answer.choices[0].message
        if not message.tool_calls:
            return Outcome(text=message.content)
        messages.append(message)  # as LiteLLM's function-calling guide does
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": forecast(**json.loads(call.function.arguments))})


def sync(coroutine: Callable[..., Any]) -> Callable[..., Outcome]:
    def driver(*args: Any, **kwargs: Any) -> Outcome:
        result: Outcome = asyncio.run(coroutine(*args, **kwargs))
        return result
    return driver


DRIVERS: dict[str, Driver] = {
    "openai-python-sync": openai_sync,
    "openai-python-async": sync(openai_async),
    "openai-agents": sync(openai_agents),
    "pydantic-ai": sync(pydantic_ai),
    "pydantic-ai-deepseek": lambda s, url, key: sync(pydantic_ai)(s, url, key, deepseek_provider=True),
    "langchain-openai": langchain,
    "langchain-deepseek": lambda s, url, key: langchain(s, url, key, deepseek=True),
    "litellm-deepseek": lambda s, url, key: litellm_client(s, url, key, "deepseek"),
    "litellm-openai": lambda s, url, key: litellm_client(s, url, key, "openai"),
}
