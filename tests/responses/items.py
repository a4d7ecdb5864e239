"""Builders of Responses API requests for the tests: input items as the openai SDK and Codex send them."""

from __future__ import annotations

from typing import Any

import orjson

from chatgate.errors import Problem
from chatgate.responses.rules import check_body
from chatgate.rules.kernel import CheckOptions, UnknownModels
from chatgate.rules.models import Policy
from chatgate.verdict import Verdict

SHELL: dict[str, Any] = {"type": "function", "name": "shell", "description": "Run a command.",
                         "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                        "required": ["command"]}}
APPLY_PATCH: dict[str, Any] = {"type": "custom", "name": "apply_patch", "description": "Patch files.",
                               "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"}}
TOOLS: list[dict[str, Any]] = [SHELL, APPLY_PATCH, {"type": "web_search"}]
THOUGHT = "I should run the tests."


def user(text: str = "Fix the failing test.") -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def developer(text: str = "<hook>the build is green</hook>") -> dict[str, Any]:
    return {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": text}]}


def assistant(text: str = "Done.") -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "id": "msg_1",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def reasoning(text: str | None = THOUGHT, rid: str = "rs_1", **extra: Any) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "reasoning", "id": rid, "summary": []}
    if text is not None:
        item["content"] = [{"type": "reasoning_text", "text": text}]
    return {**item, **extra}


def call(call_id: str = "call_1", name: str = "shell", arguments: str = '{"command": "pytest"}'
         ) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
            "arguments": arguments}


def output(call_id: str = "call_1", text: str = "1 passed") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def turn(*call_ids: str, text: str | None = THOUGHT) -> list[dict[str, Any]]:
    """A thinking-mode tool turn as DeepSeek returns it (reasoning, calls) and the outputs after it."""
    calls = [call(c) for c in call_ids]
    return [reasoning(text, f"rs_{call_ids[0]}"), *calls, *(output(c) for c in call_ids)]


def request(items: list[Any], **extra: Any) -> dict[str, Any]:
    return {"model": "deepseek-flash", "input": items, "tools": TOOLS, **extra}


def check(body: dict[str, Any] | bytes, strict: bool = False, unknown_models: UnknownModels = "reject"
          ) -> Verdict:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return check_body(raw, Policy(options=CheckOptions(strict, unknown_models)))


def summary(verdict: Verdict) -> list[tuple[str, str | None, str | None]]:
    return [(p.code, p.param, p.rule) for p in verdict.problems]


def warned(verdict: Verdict) -> list[tuple[str, str | None, str | None]]:
    return [(p.code, p.param, p.rule) for p in verdict.warnings]


def only(problems: list[Problem]) -> Problem:
    assert len(problems) == 1, problems
    return problems[0]
