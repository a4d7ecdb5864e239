"""Scenarios of the compatibility zoo and what each client is expected to get on chatgate's default settings.

Every client runs the same scenarios with thinking on (DeepSeek's default) and off, streaming and not. The
table EXPECTED says what DeepSeek does with what each client sends: `completes`, or `refused_<rule>` when
the client really sends something DeepSeek refuses (a control run against the fake DeepSeek shows it). What
chatgate does follows from that and its default settings (`Scenario.expected`): it forwards what DeepSeek
accepts byte for byte; what DeepSeek refuses it answers locally with the same 400 (`refused_<rule>`), unless a
repair that is on by default fixes that rule (issue 12's `[repair]`: `repaired_<rule>`, the run completes).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

MODEL = "deepseek-flash"  # thinks unless thinking.type = "disabled" (or reasoning_effort = "none")
LEGACY_MODEL = "deepseek-v4-flash"  # still accepted, served by deepseek-flash (docs/rules-chat.md#models)
CLIENT_KEY = "sk-compat-client-0001"  # runs through chatgate (passthrough: the fake sees this key)
CONTROL_KEY = "sk-compat-control-0001"  # control runs straight against the fake DeepSeek
QUESTION = "Do I need an umbrella in Lisbon today?"
NO_THINKING: dict[str, Any] = {"thinking": {"type": "disabled"}}
TOOL_NAME = "search_forecast"
TOOL_DESCRIPTION = "Search the weather forecast."
TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": TOOL_DESCRIPTION,
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
}

Kind = Literal["tools", "handoff", "structured", "structured_tool"]
TOOLS: Kind = "tools"  # model calls search_forecast, client runs it and sends the result, model answers
HANDOFF: Kind = "handoff"  # a triage agent hands off (a tool call) to the forecaster agent, which answers
STRUCTURED: Kind = "structured"  # tool round, then a JSON answer parsed into an object
STRUCTURED_TOOL: Kind = "structured_tool"  # the object comes as the arguments of the output tool
KINDS: tuple[Kind, ...] = (TOOLS, HANDOFF, STRUCTURED, STRUCTURED_TOOL)
# Chat requests a completed run sends at least (one per model turn).
MIN_REQUESTS: dict[str, int] = {TOOLS: 2, HANDOFF: 2, STRUCTURED: 2, STRUCTURED_TOOL: 1}

COMPLETES = "completes"
REFUSED = "refused_"  # + rule: DeepSeek answers 400; chatgate answers the same 400 locally
REPAIRED = "repaired_"  # + rule: DeepSeek answers 400; chatgate repairs the request by default
Runtime = Literal["python", "node", "llamaindex"]


def forecast(q: str) -> str:
    """The tool every client runs (the fake DeepSeek always calls it with {"q": "x"})."""
    return f"forecast for {q}: light rain"


FINAL_TOOL_ANSWER = "the tool said " + forecast("x")  # the end of the fake's answer after the tool result
HANDOFF_ANSWER = 'the tool said {"assistant": "forecaster"}'  # openai-agents' handoff tool result


@dataclass(frozen=True)
class Client:
    """A client library as users point it at DeepSeek: `route` is appended to the base URL ("" = bare root,
    as DeepSeek's docs give it, or "/v1")."""

    name: str
    runtime: Runtime
    route: str
    library: str  # what it is, for reports
    model: str = MODEL


CLIENTS: dict[str, Client] = {c.name: c for c in [
    Client("openai-python-sync", "python", "/v1", "openai-python OpenAI, messages kept by hand"),
    Client("openai-python-async", "python", "/v1", "openai-python AsyncOpenAI, .stream() helper"),
    Client("openai-node", "node", "/v1", "openai-node, messages kept by hand"),
    Client("openai-node-runtools", "node", "/v1", "openai-node beta.chat.completions.runTools"),
    Client("openai-agents", "python", "/v1", "openai-agents OpenAIChatCompletionsModel"),
    Client("pydantic-ai", "python", "/v1", "pydantic-ai OpenAIChatModel + OpenAIProvider(base_url)"),
    Client("pydantic-ai-deepseek", "python", "", "pydantic-ai OpenAIChatModel + DeepSeekProvider",
           LEGACY_MODEL),
    Client("langchain-openai", "python", "/v1", "langchain-openai ChatOpenAI"),
    Client("langchain-deepseek", "python", "", "langchain-deepseek ChatDeepSeek"),
    Client("llamaindex", "llamaindex", "/v1", "llama-index-llms-openai-like OpenAILike"),
    Client("vercel-ai-deepseek", "node", "", "Vercel AI SDK ai + @ai-sdk/deepseek", LEGACY_MODEL),
    Client("vercel-ai-openai-compatible", "node", "/v1", "Vercel AI SDK ai + @ai-sdk/openai-compatible"),
    Client("litellm-deepseek", "python", "", "litellm.completion(model='deepseek/…')", LEGACY_MODEL),
    Client("litellm-openai", "python", "/v1", "litellm.completion(model='openai/…')"),
]}

# What DeepSeek does with what each client sends: (client, kind) -> (thinking on, thinking off), the same for
# streaming and non-streaming runs.
EXPECTED: dict[tuple[str, Kind], tuple[str, str]] = {
    ("openai-python-sync", TOOLS): (COMPLETES, COMPLETES),
    ("openai-python-async", TOOLS): (COMPLETES, COMPLETES),
    ("openai-node", TOOLS): (COMPLETES, COMPLETES),
    ("openai-node-runtools", TOOLS): (COMPLETES, COMPLETES),
    ("openai-agents", TOOLS): (COMPLETES, COMPLETES),
    ("openai-agents", HANDOFF): (COMPLETES, COMPLETES),
    # output_type asks for response_format json_schema, which DeepSeek does not offer (R23).
    ("openai-agents", STRUCTURED): ("refused_R23", "refused_R23"),
    ("pydantic-ai", TOOLS): (COMPLETES, COMPLETES),
    ("pydantic-ai", STRUCTURED): (COMPLETES, COMPLETES),  # PromptedOutput: response_format json_object
    # The default ToolOutput sends tool_choice "required", refused while the model thinks (R34); the
    # DeepSeek provider knows and sends "auto".
    ("pydantic-ai", STRUCTURED_TOOL): ("refused_R34", COMPLETES),
    ("pydantic-ai-deepseek", TOOLS): (COMPLETES, COMPLETES),
    ("pydantic-ai-deepseek", STRUCTURED): (COMPLETES, COMPLETES),
    ("pydantic-ai-deepseek", STRUCTURED_TOOL): (COMPLETES, COMPLETES),
    # Both LangChain models keep reasoning_content only in additional_kwargs and never send it back.
    ("langchain-openai", TOOLS): ("refused_R17", COMPLETES),
    ("langchain-deepseek", TOOLS): ("refused_R17", COMPLETES),
    ("llamaindex", TOOLS): ("refused_R17", COMPLETES),  # ChatMessage drops it as well
    ("vercel-ai-deepseek", TOOLS): (COMPLETES, COMPLETES),
    ("vercel-ai-openai-compatible", TOOLS): (COMPLETES, COMPLETES),
    ("litellm-deepseek", TOOLS): (COMPLETES, COMPLETES),
    ("litellm-openai", TOOLS): (COMPLETES, COMPLETES),
}


@dataclass(frozen=True)
class RefusalRule:
    """A rule of docs/rules-chat.md a zoo client can break: chatgate's code, DeepSeek's own 400 text, the
    param blamed."""

    rule: str
    code: str
    deepseek_message: str
    param: Callable[[dict[str, Any]], str]


def missing_reasoning_param(body: dict[str, Any]) -> str:
    """The first assistant message with tool_calls but no reasoning_content string (R17)."""
    for i, message in enumerate(body["messages"]):
        if message.get("role") == "assistant" and message.get("tool_calls") \
                and not isinstance(message.get("reasoning_content"), str):
            return f"messages[{i}].reasoning_content"
    raise AssertionError("no assistant tool call lacks reasoning_content")


REFUSALS: dict[str, RefusalRule] = {r.rule: r for r in [
    RefusalRule("R17", "reasoning_content_missing",
                "The `reasoning_content` in the thinking mode must be passed back to the API",
                missing_reasoning_param),
    RefusalRule("R23", "unsupported_response_format", "This response_format type is unavailable now",
                lambda body: "response_format.type"),
    RefusalRule("R34", "tool_choice_in_thinking", "Thinking mode does not support this tool_choice",
                lambda body: "tool_choice"),
]}


@functools.cache
def chatgate_repairs() -> frozenset[str]:
    """The rules (docs/rules-chat.md) chatgate's default settings repair instead of refusing; none before
    issue 12."""
    try:
        from chatgate.repair.base import RULES
    except ImportError:
        return frozenset()
    from chatgate.settings import Settings

    return frozenset(rule for name in Settings().repair.options().enabled for rule in RULES[name])


@dataclass(frozen=True)
class Scenario:
    client: str
    kind: Kind
    thinking: bool
    stream: bool

    @property
    def id(self) -> str:
        return (f"{self.client}.{self.kind}.{'think' if self.thinking else 'nothink'}"
                f".{'stream' if self.stream else 'plain'}")

    @property
    def model(self) -> str:
        return CLIENTS[self.client].model

    @property
    def prompt(self) -> str:
        """The user's question, tagged so that every request of the run can be told apart."""
        return f"{QUESTION} [zoo:{self.id}]"

    @property
    def deepseek(self) -> str:
        """What DeepSeek does with what this client sends (the table)."""
        on, off = EXPECTED[(self.client, self.kind)]
        return on if self.thinking else off

    @property
    def expected(self) -> str:
        """What chatgate does on its default settings: completes, refused_<rule> or repaired_<rule>."""
        rule = self.deepseek.removeprefix(REFUSED)
        return REPAIRED + rule if rule in chatgate_repairs() else self.deepseek

    @property
    def refusal(self) -> RefusalRule | None:
        """The rule DeepSeek refuses this client's requests by, if any."""
        return None if self.deepseek == COMPLETES else REFUSALS[self.deepseek.removeprefix(REFUSED)]

    def job(self, base_url: str, api_key: str, target: str) -> dict[str, Any]:
        """What an out-of-process driver needs to run this scenario."""
        return {"id": self.id, "client": self.client, "kind": self.kind, "thinking": self.thinking,
                "stream": self.stream, "prompt": self.prompt, "model": self.model, "base_url": base_url,
                "api_key": api_key, "target": target, "no_thinking": NO_THINKING, "tool": TOOL_SCHEMA}


def scenarios(client: str | None = None) -> Iterator[Scenario]:
    for (name, kind) in EXPECTED:
        if client is None or name == client:
            for thinking in (True, False):
                for stream in (False, True):
                    yield Scenario(name, kind, thinking, stream)


@dataclass
class Outcome:
    """What the client returned: its final text (or structured output), or the error it raised."""

    text: str | None = None
    output: Any = None
    status: int | None = None  # HTTP status of the error the client raised
    error: str | None = None  # the exception, for the failure message

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        return cls(data.get("text"), data.get("output"), data.get("status"), data.get("error"))


TAG = re.compile(rb"\[zoo:([A-Za-z0-9_.-]+)\]")
CALL_ID = re.compile(rb"call_00_[A-Za-z0-9]{24}")


def tag_of(body: bytes) -> str | None:
    found = TAG.search(body)
    return found.group(1).decode() if found else None


def renumber_call_ids(body: bytes, ids: dict[bytes, bytes]) -> bytes:
    """Replace the fake's random tool-call ids (same length, numbered in order of first appearance)."""
    def number(match: re.Match[bytes]) -> bytes:
        return ids.setdefault(match.group(0), b"call_00_%024d" % (len(ids) + 1))
    return CALL_ID.sub(number, body)


def as_json(body: bytes) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(body)
    return data
