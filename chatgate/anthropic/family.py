"""The Anthropic Messages family as the gateway sees it (chatgate/gateway/family.py): DeepSeek's `/anthropic`
route, Anthropic's error shape (so the Anthropic SDKs and Claude Code raise and show it), its stream."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import orjson

from chatgate.anthropic.prompt import MESSAGES_PROMPT
from chatgate.anthropic.repairs import message_index, repair_messages, thinking_wanted, tool_calls_of, wanted
from chatgate.anthropic.rules import check_body
from chatgate.anthropic.stream import (
    MessagesMeter,
    StreamedThinkingTurn,
    calls_from_message,
    tokens_from_usage,
    turn_from_message,
)
from chatgate.errors import APIError, Problem
from chatgate.gateway.family import CountRoutes, FamilyBase
from chatgate.metering.cache import PromptShape
from chatgate.metering.calls import ModelCalls
from chatgate.metering.usage import TokenCounts
from chatgate.profiles import ModelProfile
from chatgate.repair.base import Applied, RepairOptions, Turn
from chatgate.rules.models import Policy
from chatgate.sse import LineWatcher
from chatgate.verdict import Verdict

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               529: "overloaded_error"}


COUNT_TOKENS_LABEL = "/anthropic/v1/messages/count_tokens"
COUNT_TOKENS_PATHS = (COUNT_TOKENS_LABEL, "/anthropic/messages/count_tokens")


def count_text(data: Any) -> str:
    """The text `count_tokens` counts (chatgate answers it: DeepSeek documents no such route), or the 400."""
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise APIError(400, "count_tokens needs a JSON object with 'model' and 'messages', as for "
                       "/anthropic/v1/messages.", "invalid_request_error", "messages",
                       "missing_required_parameter")
    return prompt_text(data)


class MessagesFamily(FamilyBase):
    name = "anthropic-messages"
    turn_kind = "anthropic"
    history: str | None = "anthropic"
    restore_codes = frozenset({"thinking_block_missing"})
    restore_repair: str | None = "restore_thinking"
    routes: Sequence[tuple[str, str, str, bool]] = (
        ("/anthropic/v1/messages", "/anthropic/v1/messages", "/anthropic/v1/messages", False),
        ("/anthropic/messages", "/anthropic/v1/messages", "/anthropic/v1/messages", False),
    )
    validate_routes: Sequence[tuple[str, bool]] = (
        ("/anthropic/v1/messages/validate", False), ("/anthropic/messages/validate", False),
    )
    token_counts: CountRoutes = tuple((path, COUNT_TOKENS_LABEL, count_text) for path in COUNT_TOKENS_PATHS)
    path_prefix = "/anthropic/"
    prompt: PromptShape | None = MESSAGES_PROMPT

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def check(self, body: bytes, *, beta: bool, origin: str | None, parse: object = None) -> Verdict:
        return check_body(body, self.policy, parse)

    def repairable(self, found: Sequence[Problem], options: RepairOptions) -> bool:
        return wanted(found, options)

    def turns_to_restore(self, data: dict[str, Any], found: Sequence[Problem], options: RepairOptions
                         ) -> dict[int, tuple[tuple[str, ...], tuple[str, ...]]]:
        return thinking_wanted(data, found, options)

    def turn_of(self, data: dict[str, Any], problem: Problem) -> tuple[str, ...] | None:
        i = message_index(problem)
        messages = data.get("messages") or []
        return tool_calls_of(messages[i])[0] if i is not None and i < len(messages) else None

    def repair(self, data: dict[str, Any], found: Sequence[Problem], options: RepairOptions,
               profile: ModelProfile | None, recalled: dict[int, str]) -> list[Applied]:
        return repair_messages(data, found, options, recalled)

    def render_error(self, error: APIError, request_id: str | None) -> tuple[bytes, dict[str, str]]:
        """Anthropic's envelope, with chatgate's param, code and problems inside `error`."""
        rid = request_id or "req_" + secrets.token_hex(12)
        inner: dict[str, Any] = {"type": ERROR_TYPES.get(error.status, "api_error"), "message": error.message,
                                 "param": error.param, "code": error.code}
        if error.problems:
            inner["problems"] = [p.as_dict() for p in error.problems]
        if error.repairs:
            inner["repairs"] = error.repairs
        headers = {"request-id": rid}
        if error.status in (400, 401, 403, 404, 413, 415, 431):
            headers["x-should-retry"] = "false"
        return orjson.dumps({"type": "error", "error": inner, "request_id": rid}), headers

    def stream_error(self, error: APIError) -> bytes:
        payload = {"type": "error", "error": {"type": ERROR_TYPES.get(error.status, "api_error"),
                                              "message": error.message, "code": error.code}}
        return b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"

    def usage(self, answer: Any) -> TokenCounts | None:
        return tokens_from_usage(answer.get("usage")) if isinstance(answer, dict) else None

    def served_model(self, answer: Any) -> str | None:
        model = answer.get("model") if isinstance(answer, dict) else None
        return model if isinstance(model, str) else None

    def answer_turn(self, answer: Any) -> Turn | None:
        return turn_from_message(answer)

    def model_calls(self, answer: Any) -> ModelCalls | None:
        return calls_from_message(answer)

    def meter(self, watcher: LineWatcher | None = None) -> MessagesMeter:
        return MessagesMeter(watcher)

    def stream_turns(self) -> StreamedThinkingTurn:
        return StreamedThinkingTurn()

    def prompt_text(self, data: dict[str, Any]) -> str:
        return prompt_text(data)


def prompt_text(data: dict[str, Any]) -> str:
    """The text of a Messages request as the model sees it (roughly): system, messages, tools."""
    parts: list[str] = []
    system = data.get("system")
    parts.append(system if isinstance(system, str) else _blocks_text(system))
    for msg in data.get("messages") or ():
        if isinstance(msg, dict):
            parts.append(str(msg.get("role", "")))
            content = msg.get("content")
            parts.append(content if isinstance(content, str) else _blocks_text(content))
    for tool in data.get("tools") or ():
        if isinstance(tool, dict):
            fields = {k: tool.get(k) for k in ("name", "description", "input_schema")}
            parts.append(orjson.dumps(fields).decode())
    return "\n".join(p for p in parts if p)


def _blocks_text(blocks: Any) -> str:
    out: list[str] = []
    for b in blocks if isinstance(blocks, list) else ():
        if not isinstance(b, dict):
            continue
        kind = b.get("type")
        if kind == "text" and isinstance(b.get("text"), str):
            out.append(b["text"])
        elif kind == "thinking" and isinstance(b.get("thinking"), str):
            out.append(b["thinking"])
        elif kind in ("tool_use", "server_tool_use"):
            out.append(f"{b.get('name', '')} {orjson.dumps(b.get('input')).decode()}")
        elif kind in ("tool_result", "web_search_tool_result"):
            content = b.get("content")
            out.append(content if isinstance(content, str) else _blocks_text(content))
    return "\n".join(out)
