"""Writes tests/corpus/codex/codex.jsonl: request bodies and headers shaped as Codex (CLI, Desktop, VS Code)
sends them to DeepSeek's native Responses API (docs/rules-responses.md#what-codex-sends), each with what
chatgate must do on default settings: `unchanged` (forwarded byte for byte), `repaired:<repairs>`,
`refused:<code>` (never reaches DeepSeek) or `deepseek:<status>` (forwarded with a warning, DeepSeek's own
answer relayed), and the rules it must warn about. Run `python -m tests.corpus.codex.build` after changing a
case."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("codex.jsonl")

INSTRUCTIONS = (
    "You are Codex, based on GPT-5. You are running as a coding agent in the Codex CLI on a user's "
    "computer.\n\n## General\n\n- When searching for text or files, prefer using `rg`."
)
SHELL = {
    "type": "function",
    "name": "shell",
    "description": "Runs a shell command and returns its output.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {
            "command": {"type": "array", "items": {"type": "string"}},
            "workdir": {"type": "string"},
            "timeout_ms": {"type": "number"},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
}
PLAN = {
    "type": "function",
    "name": "update_plan",
    "description": "Updates the task plan.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {"plan": {"type": "array", "items": {"type": "object"}}},
        "required": ["plan"],
        "additionalProperties": False,
    },
}
VIEW_IMAGE = {
    "type": "function",
    "name": "view_image",
    "description": "Attach a local image.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
        "additionalProperties": False,
    },
}
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Use the `apply_patch` tool to edit files.",
    "format": {
        "type": "grammar",
        "syntax": "lark",
        "definition": 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF',
    },
}
TOOLS = [SHELL, PLAN, VIEW_IMAGE, APPLY_PATCH, {"type": "web_search"}]
HEADERS = {
    "originator": "codex_cli_rs",
    "user-agent": "codex_cli_rs/0.165.0 (Ubuntu 24.4.0; x86_64) xterm-256color",
    "accept": "text/event-stream",
    "session_id": "0199f3c2-6c1e-7a20-9d4e-3f1b2a6c8e01",
    "x-client-request-id": "0199f3c2-6c1e-7a20-9d4e-3f1b2a6c8e01",
    "x-codex-turn-metadata": '{"turn_id":"t1"}',
    "x-codex-beta-features": "unified_exec",
}


def msg(role: str, text: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def reasoning(n: int, text: str | None = None, **extra: Any) -> dict[str, Any]:
    item: dict[str, Any] = {
        "type": "reasoning",
        "id": f"rs_{n:04d}",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text or f"Step {n}: look again."}],
        "encrypted_content": f"d8b79690-7c51-4f2e-9a1b-{n:012d}-0",
    }
    item.update(extra)
    return {k: v for k, v in item.items() if v is not None}


def call(call_id: str, command: str = "pytest -q") -> dict[str, Any]:
    return {
        "type": "function_call",
        "name": "shell",
        "call_id": call_id,
        "arguments": json.dumps({"command": ["bash", "-lc", command], "workdir": "/home/dev/project"}),
    }


def out(call_id: str, text: str = "Exit code: 0\nOutput:\n3 passed") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def opening() -> list[dict[str, Any]]:
    return [
        msg("developer", "<permissions instructions>Approval policy: on-request</permissions instructions>"),
        msg(
            "user",
            "<environment_context>\n  <cwd>/home/dev/project</cwd>\n  <shell>bash</shell>\n"
            "</environment_context>",
        ),
        msg("user", "The tests in tests/test_api.py fail. Fix them."),
    ]


def rounds(n: int, start: int = 1) -> list[dict[str, Any]]:
    """n agent rounds as DeepSeek answered them: reasoning, parallel calls every third round, outputs."""
    items: list[dict[str, Any]] = []
    for k in range(start, start + n):
        ids = [f"call_00_{k:04d}a"] + ([f"call_01_{k:04d}b"] if k % 3 == 0 else [])
        items += [reasoning(k), *(call(i, f"rg -n test_{k}") for i in ids), *(out(i) for i in ids)]
    return items


def body(items: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "model": "deepseek-flash",
        "instructions": INSTRUCTIONS,
        "input": items,
        "tools": TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"effort": "high", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199f3c2-6c1e-7a20-9d4e-3f1b2a6c8e01",
        "text": {"verbosity": "medium"},
        **extra,
    }


PATCH_CALL = {
    "type": "custom_tool_call",
    "call_id": "call_00_patch",
    "name": "apply_patch",
    "input": "*** Begin Patch\n*** Update File: app.py\n@@\n-x = 1\n+x = 2\n*** End Patch\n",
}
PATCH_OUT = {
    "type": "custom_tool_call_output",
    "call_id": "call_00_patch",
    "output": '{"output":"Success. Updated the following files:\\nM app.py\\n","metadata":{"exit_code":0}}',
}
SEARCH = {
    "type": "web_search_call",
    "id": "ws_0001",
    "status": "completed",
    "action": {"type": "search", "query": "pytest monkeypatch env var"},
}
OPENAI_REASONING = {
    "type": "reasoning",
    "id": "rs_68a1f0",
    "encrypted_content": "gAAAAABo-openai-fernet-token==",
    "summary": [
        {"type": "summary_text", "text": "**Locating the failing assertion**"},
        {"type": "summary_text", "text": "I will read tests/test_api.py first."},
    ],
}
IMAGE = {
    "type": "input_image",
    "image_url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJ"
    "AAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==",
}


def cases() -> list[dict[str, Any]]:
    first = opening()
    history = [*first, *rounds(3)]
    return [
        {"name": "first-turn", "expect": "unchanged", "body": body(first)},
        {
            "name": "long-history-with-reasoning",
            "expect": "unchanged",
            "body": body(
                [
                    *first,
                    *rounds(40),
                    reasoning(99),
                    msg("assistant", "Fixed: 3 passed."),
                    msg("user", "Now run the linter."),
                ]
            ),
        },
        {
            "name": "apply-patch-round-trip",
            "expect": "unchanged",
            "body": body([*history, reasoning(50, "Patch app.py."), PATCH_CALL, PATCH_OUT]),
        },
        {
            "name": "web-search-replayed",
            "expect": "unchanged",
            "body": body(
                [
                    *history,
                    reasoning(60, "Search the docs."),
                    SEARCH,
                    reasoning(61),
                    call("call_00_w"),
                    out("call_00_w"),
                ]
            ),
        },
        {
            "name": "output-schema-and-client-metadata",
            "expect": "unchanged",
            "body": body(
                history,
                text={
                    "verbosity": "low",
                    "format": {
                        "type": "json_schema",
                        "name": "codex_output_schema",
                        "strict": True,
                        "schema": {
                            "type": "object",
                            "properties": {"summary": {"type": "string"}},
                            "required": ["summary"],
                            "additionalProperties": False,
                        },
                    },
                },
                client_metadata={"x-codex-installation-id": "inst_1"},
                service_tier="auto",
            ),
        },
        {
            "name": "review-subagent",
            "expect": "unchanged",
            "headers": {"x-openai-subagent": "review"},
            "body": body([msg("user", "Review the changes on this branch.")], reasoning={"effort": "low"}),
        },
        {
            "name": "view-image-output",
            "expect": "unchanged",
            "body": body(
                [
                    *first,
                    reasoning(70, "Look at the screenshot."),
                    {
                        "type": "function_call",
                        "name": "view_image",
                        "call_id": "call_00_img",
                        "arguments": '{"path":"shot.png"}',
                    },
                    {
                        "type": "function_call_output",
                        "call_id": "call_00_img",
                        "output": [{"type": "input_text", "text": "shot.png"}, IMAGE],
                    },
                ]
            ),
        },
        {
            "name": "locally-compacted-history",
            "expect": "unchanged",
            "body": body(
                [
                    msg(
                        "user",
                        "Another language model started to solve this problem and produced a "
                        "summary of its thinking process: ...",
                    ),
                    msg("user", "Continue."),
                ]
            ),
        },
        {
            "name": "multi-agent-message",
            "expect": "unchanged",
            "warns": ["P21"],
            "body": body(
                [
                    *history,
                    {"type": "agent_message", "author": "explorer", "content": "Found it."},
                    msg("user", "Go on."),
                ]
            ),
        },
        {
            "name": "previous-response-id",
            "expect": "unchanged",
            "warns": ["P20"],
            "body": body([msg("user", "hi")], previous_response_id="resp_0199f3"),
        },
        {
            "name": "hook-message-between-call-and-output",
            "expect": "repaired:responses_output_order",
            "body": body(
                [
                    *history,
                    reasoning(80),
                    call("call_00_hook"),
                    msg("developer", "<hook_output>PostToolUse: formatted 1 file</hook_output>"),
                    out("call_00_hook"),
                ]
            ),
        },
        {
            "name": "later-reasoning-between-call-and-output",
            "expect": "repaired:responses_output_order",
            "body": body(
                [
                    *history,
                    reasoning(81),
                    call("call_00_x"),
                    reasoning(82),
                    call("call_00_y"),
                    out("call_00_x"),
                    out("call_00_y"),
                ]
            ),
        },
        {
            "name": "openai-reasoning-from-a-mixed-session",
            "expect": "repaired:responses_reasoning",
            "warns": ["P22"],
            "body": body([*first, OPENAI_REASONING, call("call_oa_1"), out("call_oa_1")]),
        },
        {
            "name": "heartbeat-without-call-id",
            "expect": "refused:missing_call_id",
            "body": body(
                [
                    *history,
                    {"type": "function_call_output", "id": "automation_heartbeat", "output": "heartbeat"},
                ]
            ),
        },
        {
            "name": "orphan-automation-output",
            "expect": "refused:tool_output_without_call",
            "body": body([*history, out("call_automation_update", '{"status":"updated"}')]),
        },
        {
            "name": "reasoning-stripped-by-a-proxy",
            "expect": "refused:reasoning_text_missing",
            "body": body([*first, call("call_00_s"), out("call_00_s")]),
        },
        {
            "name": "interrupted-turn",
            "expect": "refused:tool_output_missing",
            "body": body(
                [*history, reasoning(90), call("call_00_int"), msg("user", "Stop, do it differently.")]
            ),
        },
        {
            "name": "freeform-tool-other-than-apply-patch",
            "expect": "refused:unsupported_custom_tool",
            "body": body(
                first, tools=[*TOOLS, {"type": "custom", "name": "js_repl", "description": "Run JS."}]
            ),
        },
        {
            "name": "compaction-trigger",
            "expect": "unchanged",
            "warns": ["P21"],
            "body": body([*history, {"type": "compaction_trigger"}]),
        },
        {
            "name": "misspelt-model",
            "expect": "refused:model_not_found",
            "body": body(first, model="deepseek-v4.1-flash"),
        },
    ]


def main() -> None:
    lines = [
        json.dumps(
            {"headers": HEADERS, **case} | {"headers": {**HEADERS, **case.get("headers", {})}},
            ensure_ascii=False,
        )
        for case in cases()
    ]
    OUT.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
