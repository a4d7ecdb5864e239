"""The OpenAI chat-completions family as the gateway sees it (chatgate/gateway/family.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from chatgate.errors import Problem
from chatgate.gateway.family import FamilyBase
from chatgate.metering.cache import PromptShape
from chatgate.openai.answers import ChatStreamedTurn, turn_from_completion
from chatgate.openai.prompt import CHAT_PROMPT
from chatgate.openai.repairs import (
    calls_of,
    message_index,
    reasoning_in_place,
    reasoning_wanted,
    repair_chat,
    wanted,
)
from chatgate.openai.rules import check_body
from chatgate.openai.stream import ChatStreamMeter, UsageStripper
from chatgate.profiles import ModelProfile
from chatgate.repair.base import Applied, InPlace, RepairOptions, Turn
from chatgate.rules.models import Policy
from chatgate.sse import LineWatcher
from chatgate.verdict import Verdict


class ChatFamily(FamilyBase):
    name = "openai-chat"
    turn_kind = "chat"
    history: str | None = "chat"
    restore_codes = frozenset({"reasoning_content_missing"})
    restore_repair: str | None = "restore_reasoning"
    routes: Sequence[tuple[str, str, str, bool]] = (
        ("/v1/chat/completions", "/v1/chat/completions", "/chat/completions", False),
        ("/chat/completions", "/chat/completions", "/chat/completions", False),
        ("/beta/chat/completions", "/beta/chat/completions", "/beta/chat/completions", True),
        ("/v1/beta/chat/completions", "/beta/chat/completions", "/beta/chat/completions", True),
    )
    prompt: PromptShape | None = CHAT_PROMPT
    validate_routes: Sequence[tuple[str, bool]] = (
        ("/v1/chat/completions/validate", False), ("/chat/completions/validate", False),
        ("/beta/chat/completions/validate", True), ("/v1/beta/chat/completions/validate", True),
    )

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def check(self, body: bytes, *, beta: bool, origin: str | None, parse: object = None) -> Verdict:
        checked = check_body(body, self.policy, beta=beta, origin=origin, parse=parse)
        req = checked.request
        if req is None:
            return Verdict(checked.problems, checked.warnings, profile=checked.profile)
        return Verdict(checked.problems, checked.warnings, req.model, req.stream is True, checked.thinking,
                       bool(req.tools), req.max_tokens, checked.profile, checked.media, req, checked.answers)

    def repairable(self, found: Sequence[Problem], options: RepairOptions) -> bool:
        return wanted(found, options)

    def turns_to_restore(self, data: dict[str, Any], found: Sequence[Problem], options: RepairOptions
                         ) -> dict[int, tuple[tuple[str, ...], tuple[str, ...]]]:
        messages = data.get("messages") or []
        return {i: calls_of(messages[i]) for i in reasoning_wanted(found, options) if i < len(messages)}

    def restore_in_place(self, body: bytes, verdict: Verdict, options: RepairOptions) -> InPlace | None:
        req = verdict.request
        if (req is None or not verdict.problems or "restore_reasoning" not in options.enabled
                or (verdict.warnings and wanted(verdict.warnings, options))):
            return None
        return reasoning_in_place(body, req.messages, verdict.problems)

    def turn_of(self, data: dict[str, Any], problem: Problem) -> tuple[str, ...] | None:
        i = message_index(problem)
        messages = data.get("messages") or []
        return calls_of(messages[i])[0] if i is not None and i < len(messages) else None

    def repair(self, data: dict[str, Any], found: Sequence[Problem], options: RepairOptions,
               profile: ModelProfile | None, recalled: dict[int, str]) -> list[Applied]:
        return repair_chat(data, found, options, profile, recalled)

    def answer_turn(self, answer: Any) -> Turn | None:
        return turn_from_completion(answer)

    def meter(self, watcher: LineWatcher | None = None) -> ChatStreamMeter:
        return ChatStreamMeter(watcher)

    def stream_turns(self) -> ChatStreamedTurn:
        return ChatStreamedTurn()

    def prompt_text(self, data: dict[str, Any]) -> str:
        return prompt_text(data)

    def ask_stream_usage(self, data: dict[str, Any]) -> bytes | None:
        options = data.get("stream_options") or {}
        if not data or not isinstance(options, dict) or options.get("include_usage") is True:
            return None  # asked already, or a body chatgate did not validate: leave it alone
        return orjson.dumps({**data, "stream_options": {**options, "include_usage": True}})

    def usage_filter(self) -> UsageStripper:
        return UsageStripper()


def prompt_text(body: dict[str, Any]) -> str:
    """The text of a request's messages and tools, as the model would see it (roughly)."""
    parts: list[str] = []
    for msg in body.get("messages") or ():
        if not isinstance(msg, dict):
            continue
        parts.append(str(msg.get("role", "")))
        content = msg.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(p.get("text", "") for p in content
                         if isinstance(p, dict) and p.get("type") == "text")
        for key in ("reasoning_content",):
            if isinstance(msg.get(key), str):
                parts.append(msg[key])
        for call in msg.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                parts.extend(str(fn.get(k, "")) for k in ("name", "arguments"))
    for tool in body.get("tools") or ():
        parts.append(str(tool))
    return "\n".join(parts)
