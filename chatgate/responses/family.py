"""The Responses API family as the gateway sees it (chatgate/gateway/family.py): DeepSeek's native
`/responses` (since 2026-07-31, "specifically adapted for Codex"), validated by rules P1-P23, repaired,
relayed event by event and metered; errors in the OpenAI shape, so the openai SDKs and Codex raise and show
them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from chatgate.errors import APIError, Problem
from chatgate.gateway.family import FamilyBase, NotServed
from chatgate.metering.cache import PromptShape
from chatgate.metering.calls import ModelCalls
from chatgate.metering.usage import TokenCounts
from chatgate.profiles import ModelProfile
from chatgate.repair.base import Applied, RepairOptions, Turn
from chatgate.responses.prompt import RESPONSES_PROMPT
from chatgate.responses.repairs import reasoning_wanted, repair_responses, turn_of, wanted
from chatgate.responses.rules import check_body
from chatgate.responses.stream import (
    ResponsesMeter,
    ResponsesStreamedTurn,
    calls_from_response,
    tokens_from_usage,
    turn_from_response,
)
from chatgate.rules.models import Policy
from chatgate.sse import LineWatcher
from chatgate.verdict import Verdict

ROUTE = "/responses"
COMPACT_PATHS = ("/responses/compact", "/v1/responses/compact")


def compaction_not_served(path: str, origin: str | None = None) -> APIError:
    """`/responses/compact` (Codex's remote compaction), whatever the method: DeepSeek has no remote
    compaction (docs/rules-responses.md#compaction); the 404 says how Codex compacts locally instead."""
    return APIError(
        404, f"{path} is not served: DeepSeek has no remote compaction (no /responses/compact and no "
             "compaction items). Codex compacts remotely only when its model provider is named \"OpenAI\" "
             "(or is Azure); give the provider another name in ~/.codex/config.toml "
             "([model_providers.deepseek] name = \"deepseek\") and Codex compacts locally with an ordinary "
             "/responses turn, which chatgate forwards.",
        "invalid_request_error", None, "compaction_not_supported")


class ResponsesFamily(FamilyBase):
    name = "openai-responses"
    turn_kind = "responses"
    history: str | None = "responses"
    restore_codes = frozenset({"reasoning_text_missing"})
    restore_repair: str | None = "responses_reasoning"
    routes: Sequence[tuple[str, str, str, bool]] = (
        ("/v1/responses", ROUTE, ROUTE, False),
        ("/responses", ROUTE, ROUTE, False),
    )
    validate_routes: Sequence[tuple[str, bool]] = (("/v1/responses/validate", False),
                                                   ("/responses/validate", False))
    not_served: NotServed = tuple((path, compaction_not_served) for path in COMPACT_PATHS)
    prompt: PromptShape | None = RESPONSES_PROMPT

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def check(self, body: bytes, *, beta: bool, origin: str | None, parse: object = None) -> Verdict:
        return check_body(body, self.policy, parse)

    def repairable(self, found: Sequence[Problem], options: RepairOptions) -> bool:
        return wanted(found, options)

    def turns_to_restore(self, data: dict[str, Any], found: Sequence[Problem], options: RepairOptions
                         ) -> dict[int, tuple[tuple[str, ...], tuple[str, ...]]]:
        return reasoning_wanted(data, found, options)

    def turn_of(self, data: dict[str, Any], problem: Problem) -> tuple[str, ...] | None:
        return turn_of(data, problem)

    def repair(self, data: dict[str, Any], found: Sequence[Problem], options: RepairOptions,
               profile: ModelProfile | None, recalled: dict[int, str]) -> list[Applied]:
        return repair_responses(data, found, options, recalled)

    def stream_error(self, error: APIError) -> bytes:
        """OpenAI's `error` stream event; its `error` object also makes the openai SDKs raise."""
        inner = error.body()["error"]
        payload = {"type": "error", "code": error.code, "message": error.message, "param": error.param,
                   "error": inner}
        return b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"

    def usage(self, answer: Any) -> TokenCounts | None:
        return tokens_from_usage(answer.get("usage")) if isinstance(answer, dict) else None

    def served_model(self, answer: Any) -> str | None:
        model = answer.get("model") if isinstance(answer, dict) else None
        return model if isinstance(model, str) and model else None

    def answer_turn(self, answer: Any) -> Turn | None:
        return turn_from_response(answer)

    def model_calls(self, answer: Any) -> ModelCalls | None:
        return calls_from_response(answer)

    def meter(self, watcher: LineWatcher | None = None) -> ResponsesMeter:
        return ResponsesMeter(watcher)

    def stream_turns(self) -> ResponsesStreamedTurn:
        return ResponsesStreamedTurn()

    def prompt_text(self, data: dict[str, Any]) -> str:
        return prompt_text(data)


def prompt_text(data: dict[str, Any]) -> str:
    """The text of a Responses request as the model sees it (roughly): instructions, input, tools."""
    parts: list[str] = []
    instructions = data.get("instructions")
    if isinstance(instructions, str):
        parts.append(instructions)
    value = data.get("input")
    if isinstance(value, str):
        parts.append(value)
    for item in value if isinstance(value, list) else ():
        if isinstance(item, dict):
            parts.append(_item_text(item))
    for tool in data.get("tools") or ():
        if isinstance(tool, dict):
            parts.append(orjson.dumps(tool).decode())
    return "\n".join(p for p in parts if p)


def _item_text(item: dict[str, Any]) -> str:
    kind = item.get("type", "message")
    if kind == "message":
        return f"{item.get('role', '')}\n{_parts_text(item.get('content'))}"
    if kind in ("function_call", "custom_tool_call"):
        return f"{item.get('name', '')} {item.get('arguments', item.get('input', ''))}"
    if kind in ("function_call_output", "custom_tool_call_output"):
        return _parts_text(item.get("output"))
    if kind == "reasoning":
        return _parts_text(item.get("content"))
    return ""


def _parts_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p)
