"""Writes tests/corpus/anthropic/claude-code.jsonl: request bodies shaped as Claude Code sends them to
DeepSeek's Anthropic route (docs/rules-anthropic.md#what-claude-code-sends), each with what chatgate must do
on default settings. Run `python -m tests.corpus.anthropic.build` after changing a case."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("claude-code.jsonl")

SYSTEM = [
    {
        "type": "text",
        "text": "You are Claude Code, Anthropic's official CLI for Claude.",
        "cache_control": {"type": "ephemeral"},
    },
    {
        "type": "text",
        "text": "# Environment\nWorking directory: /home/dev/project",
        "cache_control": {"type": "ephemeral"},
    },
]
TOOL_NAMES = [
    "Task",
    "Bash",
    "Glob",
    "Grep",
    "LS",
    "ExitPlanMode",
    "Read",
    "Edit",
    "MultiEdit",
    "Write",
    "NotebookEdit",
    "WebFetch",
    "TodoWrite",
    "WebSearch",
    "BashOutput",
    "KillShell",
    *(
        f"mcp__github__{n}"
        for n in (
            "create_issue",
            "get_issue",
            "list_prs",
            "create_pr",
            "merge_pr",
            "add_comment",
            "search_code",
            "get_file",
        )
    ),
]
TOOLS = [
    {
        "name": n,
        "description": f"The {n} tool.",
        "input_schema": {
            "type": "object",
            "properties": {"arg": {"type": "string"}},
            "required": ["arg"],
            "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#",
        },
    }
    for n in TOOL_NAMES
]
TOOLS[-1]["cache_control"] = {"type": "ephemeral"}
USER_ID = json.dumps({"device_id": "ea10c3f2", "account_uuid": "", "session_id": "db60a1b2"})
BETAS = "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27"


def base(**extra: Any) -> dict[str, Any]:
    body = {
        "model": "deepseek-v4-pro",
        "max_tokens": 32000,
        "system": SYSTEM,
        "tools": TOOLS,
        "metadata": {"user_id": USER_ID},
        "stream": True,
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "Why does the test fail?",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            }
        ],
    }
    body.update(extra)
    return body


def turn(call_id: str, name: str = "Read", with_thinking: bool = True) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if with_thinking:
        blocks.append({"type": "thinking", "thinking": "I will look at the test.", "signature": "5e0c1d2a"})
    blocks += [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": call_id, "name": name, "input": {"arg": "tests/test_x.py"}},
    ]
    return [
        {"role": "assistant", "content": blocks},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": call_id,
                    "content": [{"type": "text", "text": "def test_x(): assert f() == 2"}],
                }
            ],
        },
    ]


def history(rounds: int, with_thinking: bool = True) -> list[dict[str, Any]]:
    msgs = base()["messages"]
    for r in range(rounds):
        msgs += turn(f"call_{r:02d}_kw66qNnNto11bSfJVIdl", with_thinking=with_thinking)
    return msgs


CASES: list[tuple[str, str, dict[str, Any]]] = [
    (
        "first turn, adaptive thinking, effort max",
        "unchanged",
        base(
            thinking={"type": "adaptive"},
            output_config={"effort": "max"},
            context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        ),
    ),
    (
        "first turn, enabled with budget_tokens",
        "unchanged",
        base(model="claude-opus-5-0", thinking={"type": "enabled", "budget_tokens": 31999}),
    ),
    ("[1m] model as set in DOC-cc, stripped by Claude Code", "unchanged", base(model="deepseek-v4-pro")),
    ("three-round tool loop with thinking replayed", "unchanged", base(messages=history(3))),
    (
        "tool loop with thinking stripped by a proxy",
        "repaired:restore_thinking",
        base(messages=history(2, with_thinking=False)),
    ),
    (
        "subagent: thinking disabled with an effort (Claude Code >= 2.1.166)",
        "repaired:thinking_conflict",
        base(
            model="deepseek-flash",
            thinking={"type": "disabled"},
            output_config={"effort": "high"},
            max_tokens=64000,
        ),
    ),
    (
        "WebSearch: forced tool choice in thinking mode",
        "refused:tool_choice_in_thinking",
        base(
            tools=[*TOOLS, {"type": "web_search_20250305", "name": "web_search", "max_uses": 8}],
            tool_choice={"type": "tool", "name": "WebSearch"},
        ),
    ),
    (
        "WebSearch as a subagent with thinking disabled",
        "unchanged",
        base(thinking={"type": "disabled"}, tool_choice={"type": "tool", "name": "WebSearch"}),
    ),
    (
        "server web_search tool and its results in history",
        "unchanged",
        base(
            tools=[*TOOLS, {"type": "web_search_20250305", "name": "web_search"}],
            messages=[
                *base()["messages"],
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Search.", "signature": "a1"},
                        {
                            "type": "server_tool_use",
                            "id": "srvtoolu_01",
                            "name": "web_search",
                            "input": {"query": "pytest"},
                        },
                        {
                            "type": "web_search_tool_result",
                            "tool_use_id": "srvtoolu_01",
                            "content": [
                                {
                                    "type": "web_search_result",
                                    "url": "https://docs.pytest.org",
                                    "title": "pytest",
                                }
                            ],
                        },
                        {"type": "text", "text": "Found the docs."},
                    ],
                },
                {"role": "user", "content": "thanks"},
            ],
        ),
    ),
    (
        "compacted history: results split over two messages",
        "repaired:split_tool_results",
        base(
            messages=[
                *base()["messages"],
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Two reads.", "signature": "b2"},
                        {"type": "tool_use", "id": "call_a", "name": "Read", "input": {"arg": "a.py"}},
                        {"type": "tool_use", "id": "call_b", "name": "Read", "input": {"arg": "b.py"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "call_a", "content": "a"}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "call_b", "content": "b"}],
                },
            ]
        ),
    ),
    (
        "mid-conversation system message (Claude Code 2.1.154)",
        "repaired:system_messages",
        base(
            messages=[
                *history(1),
                {"role": "system", "content": "Context was compacted."},
                {"role": "user", "content": "continue"},
            ]
        ),
    ),
    (
        "reasoning-only assistant turn lowered to an empty array",
        "repaired:empty_assistant",
        base(
            messages=[
                *base()["messages"],
                {"role": "assistant", "content": []},
                {"role": "user", "content": "go on"},
            ]
        ),
    ),
    (
        "an image on a model without vision",
        "refused:image_not_supported",
        base(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is in this screenshot?"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
                        },
                    ],
                }
            ]
        ),
    ),
    (
        "an image on deepseek-flash",
        "unchanged",
        base(
            model="deepseek-flash",
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is in this screenshot?"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
                        },
                    ],
                }
            ],
        ),
    ),
    ("count of max_tokens above 384K", "refused:max_tokens_out_of_range", base(max_tokens=400000)),
    (
        "no stream, plain text follow-up",
        "unchanged",
        base(
            stream=False,
            messages=[
                *history(1),
                {"role": "assistant", "content": [{"type": "text", "text": "Fixed."}]},
                {"role": "user", "content": "great"},
            ],
        ),
    ),
]


def main() -> None:
    with OUT.open("w") as f:
        for name, expect, body in CASES:
            f.write(
                json.dumps({"name": name, "expect": expect, "anthropic_beta": BETAS, "body": body}) + "\n"
            )
    print(f"wrote {len(CASES)} cases to {OUT}")


if __name__ == "__main__":
    main()
