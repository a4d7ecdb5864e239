"""Builders for Anthropic Messages requests (Claude Code's shapes), and a `check` helper over the rules."""

from __future__ import annotations

import json
from typing import Any

from chatgate.anthropic.rules import check_body
from chatgate.rules.kernel import CheckOptions, UnknownModels
from chatgate.rules.models import Policy
from chatgate.verdict import Verdict

Block = dict[str, Any]
Message = dict[str, Any]

TOOLS: list[dict[str, Any]] = [
    {"name": "Read", "description": "Read a file.",
     "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}},
                      "required": ["file_path"]}},
    {"name": "Bash", "description": "Run a command.",
     "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}},
]


def text(t: str = "Fix the failing test.") -> Block:
    return {"type": "text", "text": t}


def thinking(t: str = "I should read the test first.", signature: str | None = "sig-1") -> Block:
    block: Block = {"type": "thinking", "thinking": t}
    if signature is not None:
        block["signature"] = signature
    return block


def tool_use(tid: str = "toolu_01", name: str = "Read", **inp: Any) -> Block:
    return {"type": "tool_use", "id": tid, "name": name, "input": inp or {"file_path": "tests/test_x.py"}}


def tool_result(tid: str = "toolu_01", content: Any = "def test_x(): assert 1 == 2") -> Block:
    return {"type": "tool_result", "tool_use_id": tid, "content": content}


def user(*blocks: Block | str) -> Message:
    if len(blocks) == 1 and isinstance(blocks[0], str):
        return {"role": "user", "content": blocks[0]}
    return {"role": "user", "content": list(blocks) or [text()]}


def assistant(*blocks: Block) -> Message:
    return {"role": "assistant", "content": list(blocks)}


def request(messages: list[Message], model: str = "claude-sonnet-4-5", max_tokens: int = 32000,
            **params: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens, "messages": messages, **params}


def loop(rounds: int = 1, keep_thinking: bool = True) -> list[Message]:
    """A Claude Code tool loop: each round the model thinks, calls Read, and gets the file back."""
    msgs: list[Message] = [user("Fix the failing test.")]
    for r in range(rounds):
        tid = f"toolu_{r:02d}"
        blocks = [thinking(f"round {r}"), tool_use(tid)] if keep_thinking else [tool_use(tid)]
        msgs += [assistant(*blocks), user(tool_result(tid))]
    return msgs


def check(req: dict[str, Any] | bytes, *, strict: bool = False, unknown_models: UnknownModels = "reject"
          ) -> Verdict:
    body = req if isinstance(req, bytes) else json.dumps(req).encode()
    return check_body(body, Policy(options=CheckOptions(strict=strict, unknown_models=unknown_models)))


def summary(verdict: Verdict) -> list[tuple[str, str | None, str | None]]:
    return [(p.code, p.param, p.rule) for p in verdict.problems]


def warned(verdict: Verdict) -> list[tuple[str, str | None, str | None]]:
    return [(p.code, p.param, p.rule) for p in verdict.warnings]
