"""Thinking-mode tool loops, closed loop (its own process): c conversations, each one round after the other.

Round 1 posts system + user + tools with thinking enabled; the answer (bench/upstream.py --tool-loop) is a
reasoning + one tool call with an id unique per answer. Round 2 posts the history: the assistant turn with
its `tool_calls` but WITHOUT `reasoning_content` (what LangChain and openai-agents send back; chatgate's
restore_reasoning puts it back), or with it when `--send-reasoning` is given (what a careful client sends),
then the tool result; its answer is plain content. Then the next conversation starts.

Conversation slot i sends `Authorization: Bearer <key-prefix><i>` (chatgate remembers turns per caller).
Every non-200 answer, or an answer without the expected shape, is an error. Prints one `BENCH_JSON {...}`
line: requests/s (both rounds), loops/s, latency percentiles of the successful requests, errors by kind.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from typing import Any

import aiohttp
import orjson
import uvloop

from bench.bodies import MODEL, SYSTEM_PROMPT, TOOLS
from bench.common import CHAT_PATH, raise_nofile_limit
from bench.stats import summarize_ms

USER_TEXT = "Where is the upstream request built, and are streaming answers relayed without buffering?"
TOOL_RESULT = (
    "async def forward(request: Request) -> Response:\n"
    "    body = await request.body()\n"
    "    upstream = client.build_request('POST', url, content=body, headers=headers)\n"
    "    resp = await client.send(upstream, stream=True)\n"
) * 4


def round1(stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": USER_TEXT}],
        "tools": TOOLS,
        "thinking": {"type": "enabled"},
        "max_tokens": 4096,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def round2(first: dict[str, Any], call: dict[str, Any], reasoning: str | None) -> dict[str, Any]:
    """The history after the tool ran. `call` is the tool call as answered (id, type, function)."""
    assistant: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
    if reasoning is not None:
        assistant["reasoning_content"] = reasoning
    tool = {"role": "tool", "tool_call_id": call["id"], "content": TOOL_RESULT}
    return {**first, "messages": [*first["messages"], assistant, tool]}


def round2_body(stream: bool) -> dict[str, Any]:
    """The second request of one thinking tool loop as a client that keeps the reasoning sends it: system +
    user, the assistant's tool call with its `reasoning_content`, the tool result (about 5 KB). The same
    bytes every time, for wrk; no repair is needed."""
    from bench.upstream import TOOL_ARGUMENTS, TOOL_NAME, TOOL_REASONING

    call = {"id": "call_00_kw66qNnNto11bSfJVIdlV5Oo", "type": "function",
            "function": {"name": TOOL_NAME, "arguments": TOOL_ARGUMENTS}}
    return round2(round1(stream), call, TOOL_REASONING)


def parse_answer(raw: bytes, stream: bool) -> tuple[dict[str, Any] | None, str, str | None]:
    """(the first tool call with id/type/function, the reasoning, the finish_reason) of an answer."""
    if not stream:
        data = orjson.loads(raw)
        choice = data["choices"][0]
        message = choice["message"]
        calls = message.get("tool_calls") or []
        call = {k: calls[0][k] for k in ("id", "type", "function")} if calls else None
        return call, message.get("reasoning_content") or "", choice.get("finish_reason")
    reasoning: list[str] = []
    call_id, name, arguments = None, "", []
    finish = None
    for line in raw.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        event = orjson.loads(line[6:])
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                reasoning.append(delta["reasoning_content"])
            for part in delta.get("tool_calls") or ():
                call_id = part.get("id") or call_id
                function = part.get("function") or {}
                name = function.get("name") or name
                arguments.append(function.get("arguments") or "")
            finish = choice.get("finish_reason") or finish
    if not call_id:
        return None, "".join(reasoning), finish
    function = {"name": name, "arguments": "".join(arguments)}
    return {"id": call_id, "type": "function", "function": function}, "".join(reasoning), finish


async def run(
    url: str,
    concurrency: int,
    duration_s: float,
    stream: bool,
    send_reasoning: bool,
    key_prefix: str,
    timeout_s: float,
) -> dict[str, Any]:
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    loops = 0
    first = round1(stream)
    first_raw = orjson.dumps(first)
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def post(body: bytes, headers: dict[str, str]) -> bytes | None:
            start = time.perf_counter()
            try:
                async with session.post(url, data=body, headers=headers) as resp:
                    raw = await resp.read()
                    if resp.status != 200:
                        errors[f"http_{resp.status}"] += 1
                        if errors[f"http_{resp.status}"] == 1:
                            errors[f"first_{resp.status}: {raw[:300].decode(errors='replace')}"] += 1
                        return None
            except (aiohttp.ClientError, TimeoutError) as exc:
                errors[type(exc).__name__] += 1
                return None
            latencies.append(time.perf_counter() - start)
            return raw

        async def conversation(slot: int, deadline: float) -> None:
            nonlocal loops
            headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key_prefix}{slot}"}
            while time.perf_counter() < deadline:
                raw = await post(first_raw, headers)
                if raw is None:
                    continue
                call, reasoning, finish = parse_answer(raw, stream)
                if call is None or finish != "tool_calls":
                    errors["round1_without_tool_call"] += 1
                    continue
                body = orjson.dumps(round2(first, call, reasoning if send_reasoning else None))
                raw = await post(body, headers)
                if raw is None:
                    continue
                call, _, finish = parse_answer(raw, stream)
                if call is not None or finish != "stop":
                    errors["round2_not_content"] += 1
                    continue
                loops += 1

        t0 = time.perf_counter()
        deadline = t0 + duration_s
        await asyncio.gather(*(conversation(i, deadline) for i in range(concurrency)))
        elapsed = time.perf_counter() - t0
    kinds = {k: v for k, v in errors.items() if not k.startswith("first_")}
    result: dict[str, Any] = {
        "requests": len(latencies),
        "loops": loops,
        "rps": len(latencies) / elapsed if elapsed else 0.0,
        "loops_per_s": loops / elapsed if elapsed else 0.0,
        "errors": sum(kinds.values()),
        "error_kinds": dict(errors),
        "duration_s": elapsed,
    }
    result.update(summarize_ms(latencies))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description="closed-loop thinking-mode tool loops")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default=CHAT_PATH)
    parser.add_argument("--concurrency", type=int, default=16, help="conversations at once")
    parser.add_argument("--duration", type=float, required=True, help="seconds of starting new requests")
    parser.add_argument("--stream", action="store_true", help="both rounds streamed")
    parser.add_argument("--send-reasoning", action="store_true", help="round 2 carries reasoning_content")
    parser.add_argument("--key-prefix", default="sk-bench-", help="the Bearer key is this + the slot number")
    parser.add_argument("--timeout", type=float, default=10.0, help="per-request timeout (s)")
    args = parser.parse_args()
    raise_nofile_limit()
    result = uvloop.run(
        run(
            f"http://127.0.0.1:{args.port}{args.path}",
            args.concurrency,
            args.duration,
            args.stream,
            args.send_reasoning,
            args.key_prefix,
            args.timeout,
        )
    )
    print("BENCH_JSON " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
