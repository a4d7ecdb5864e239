"""Realistic, valid DeepSeek chat bodies: a ~6 KB tool-calling turn and long agent histories.

Every assistant message with `tool_calls` is followed directly by one `tool` message per call id and
carries `reasoning_content` (thinking mode is on: model `deepseek-flash`, `thinking.type = enabled`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson

MODEL = "deepseek-flash"
Message = dict[str, Any]

SYSTEM_PROMPT = (
    "You are Harbor, a careful software-engineering agent working inside a developer's repository. "
    "Follow the constitution: never run destructive commands without confirmation, never print secrets, "
    "prefer small reversible edits, explain each change in one sentence, and cite file paths with line "
    "numbers. When a tool fails, read its error, correct the call and retry at most twice; then report "
    "what you tried. Use the tools for every fact about the repository: do not guess file contents. "
    "Answer in the user's language. Keep answers under 300 words unless asked for more. "
    "The repository is a Python 3.11 service using FastAPI, uvicorn and httpx; tests use pytest. "
    "Coding style: ruff with line length 110, strict mypy, dataclasses with slots, no global state. "
    "Release process: changes land through pull requests with green CI; the changelog is kept by hand. "
)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a UTF-8 text file of the repository, optionally a line range.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path relative to the repository root."},
                    "start_line": {"type": "integer", "minimum": 1},
                    "end_line": {"type": "integer", "minimum": 1},
                },
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_command",
            "description": "Run a shell command in the repository and return its exit code and output.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string"},
                    "timeout_s": {"type": "number", "default": 60},
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_code",
            "description": "Search the repository for a regular expression; returns matching lines.",
            "parameters": {
                "type": "object",
                "properties": {"pattern": {"type": "string"}, "glob": {"type": "string"}},
                "required": ["pattern"],
            },
        },
    },
]

_FILE_SNIPPET = (
    "async def forward(request: Request) -> Response:\n"
    "    body = await request.body()\n"
    "    upstream = client.build_request('POST', url, content=body, headers=headers)\n"
    "    resp = await client.send(upstream, stream=True)\n"
    "    if resp.headers.get('content-type', '').startswith('text/event-stream'):\n"
    "        return StreamingResponse(resp.aiter_raw(), status_code=resp.status_code)\n"
    "    return Response(await resp.aread(), status_code=resp.status_code)\n"
)


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps(args).decode()},
    }


def _assistant_calls(reasoning: str, calls: list[dict[str, Any]], content: str = "") -> Message:
    return {"role": "assistant", "content": content, "reasoning_content": reasoning, "tool_calls": calls}


def _tool(call_id: str, content: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def agent_turn_messages() -> list[Message]:
    """System + user + two tool rounds (one with parallel calls): the body of a typical agent step."""
    c1, c2, c3 = (
        "call_00_kw66qNnNto11bSfJVIdlV5Oo",
        "call_01_Qm3vX9aT4LpZ2rWc8YhB1nEd",
        "call_00_P7sd2KqLx0Vb",
    )
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {
            "role": "user",
            "content": "The proxy adds latency under load. Find where the upstream request is built, "
            "check how streaming responses are relayed, and run the unit tests for the forwarder.",
        },
        _assistant_calls(
            "The user wants the forwarding code. I should search for the function that builds the "
            "upstream request and, in parallel, run the forwarder tests to see the current state.",
            [
                _call(c1, "search_code", {"pattern": r"build_request\(", "glob": "app/**/*.py"}),
                _call(c2, "run_command", {"command": "pytest -q tests/test_forward.py", "timeout_s": 120}),
            ],
        ),
        _tool(
            c1, "app/forward.py:41:    upstream = client.build_request('POST', url, content=body, headers=h)"
        ),
        _tool(
            c2,
            "exit code 0\n" + "." * 38 + " [100%]\n38 passed in 1.92s\n"
            "warnings summary: DeprecationWarning in tests/conftest.py:12 (event_loop fixture)",
        ),
        _assistant_calls(
            "The request is built in app/forward.py line 41. Reading lines 30-60 will show how the "
            "response is relayed, including the streaming branch and any buffering.",
            [_call(c3, "read_file", {"path": "app/forward.py", "start_line": 30, "end_line": 60})],
            content="Found it in app/forward.py; reading the surrounding code.",
        ),
        _tool(c3, _FILE_SNIPPET * 5),
    ]


def agent_body(stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": agent_turn_messages(),
        "tools": TOOLS,
        "tool_choice": "auto",
        "thinking": {"type": "enabled"},
        "reasoning_effort": "high",
        "max_tokens": 4096,
        "stream": stream,
        "user_id": "bench-agent-1",
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def history_messages(n_messages: int, n_tool_pairs: int, tool_result_chars: int = 400) -> list[Message]:
    """A valid agent history of exactly `n_messages`, `n_tool_pairs` of them assistant-call + tool pairs.

    Layout: system, then rounds of [user, (assistant tool_calls, tool) * k, assistant text], the pairs
    spread evenly over the rounds; a final user message when the count is odd.
    """
    spare = n_messages - 1 - 2 * n_tool_pairs
    rounds, extra = divmod(spare, 2)
    if rounds < 1:
        raise ValueError("not enough messages for that many tool pairs")
    filler = "line of tool output with a path app/module.py:123 and a value 0.5; " * 200
    while len(filler) < tool_result_chars:
        filler += filler
    filler = filler[:tool_result_chars]
    messages: list[Message] = [{"role": "system", "content": SYSTEM_PROMPT}]
    pair = 0
    for r in range(rounds):
        messages.append({"role": "user", "content": f"Step {r}: continue with the next part of the task."})
        for _ in range(n_tool_pairs // rounds + (1 if r < n_tool_pairs % rounds else 0)):
            call_id = f"call_{r % 100:02d}_{pair:06d}aBcDeFgHiJ"
            messages.append(
                _assistant_calls(
                    f"Round {r}: I need the next file to decide; reading app/mod_{pair}.py.",
                    [_call(call_id, "read_file", {"path": f"app/mod_{pair}.py"})],
                )
            )
            messages.append(_tool(call_id, filler))
            pair += 1
        messages.append({"role": "assistant", "content": f"Done with step {r}."})
    if extra:
        messages.append({"role": "user", "content": "Summarise what changed."})
    assert len(messages) == n_messages and pair == n_tool_pairs
    return messages


def history_body(n_messages: int, n_tool_pairs: int, tool_result_chars: int = 400) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": history_messages(n_messages, n_tool_pairs, tool_result_chars),
        "tools": TOOLS,
        "thinking": {"type": "enabled"},
        "stream": False,
    }


def big_body_bytes(target_bytes: int = 4 * 1024 * 1024) -> bytes:
    """A valid long agent history of about `target_bytes` (slightly above) of JSON."""
    n_pairs = 1200
    chars = max(200, target_bytes // n_pairs - 420)
    body = orjson.dumps(history_body(2 * n_pairs + 400, n_pairs, chars))
    while len(body) < target_bytes:
        chars += max(1, (target_bytes - len(body)) // n_pairs + 1)
        body = orjson.dumps(history_body(2 * n_pairs + 400, n_pairs, chars))
    return body


def check_pairing(messages: list[Message]) -> None:
    """Assert the DeepSeek ordering rules this module promises (used by the self-check)."""
    i = 0
    while i < len(messages):
        msg = messages[i]
        if msg["role"] == "tool":
            raise AssertionError(f"messages[{i}]: tool message without preceding tool_calls")
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            assert isinstance(msg.get("reasoning_content"), str), f"messages[{i}] lacks reasoning_content"
            ids = {c["id"] for c in msg["tool_calls"]}
            j = i + 1
            while j < len(messages) and messages[j]["role"] == "tool":
                ids.discard(messages[j]["tool_call_id"])
                j += 1
            assert not ids, f"messages[{i}]: unanswered {ids}"
            i = j
            continue
        i += 1


def write_bodies(out_dir: Path) -> dict[str, Path]:
    """Write the bodies the load generators post; returns name -> path."""
    from bench.toolloop import round2_body  # it builds on this module's prompt and tools

    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "small": orjson.dumps(agent_body(stream=False)),
        "small_stream": orjson.dumps(agent_body(stream=True)),
        "round2": orjson.dumps(round2_body(stream=False)),
        "round2_stream": orjson.dumps(round2_body(stream=True)),
        "big": big_body_bytes(),
    }
    paths: dict[str, Path] = {}
    for name, data in files.items():
        path = out_dir / f"{name}.json"
        path.write_bytes(data)
        paths[name] = path
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description="write the benchmark bodies and check them")
    parser.add_argument("--out", type=Path, default=Path("bench/results/bodies"))
    args = parser.parse_args()
    for name, path in write_bodies(args.out).items():
        data = orjson.loads(path.read_bytes())
        check_pairing(data["messages"])
        print(f"{name}: {path.stat().st_size} bytes, {len(data['messages'])} messages")
    hist = history_messages(1000, 200)
    check_pairing(hist)
    pairs = sum(1 for m in hist if m.get("tool_calls"))
    print(f"validation history: {len(hist)} messages, {pairs} tool pairs")


if __name__ == "__main__":
    main()
