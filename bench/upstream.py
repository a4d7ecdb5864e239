"""A fast fake DeepSeek upstream: raw asyncio HTTP/1.1 (httptools parser, uvloop), one process.

POST /chat/completions (and /v1/..., /beta/...) answers a small `chat.completion` with `usage`, or, when the
body has `"stream": true`, an SSE stream of `--chunks` content chunks, a last chunk carrying `usage`, and
`data: [DONE]`. `--delay` holds every answer (slow-upstream scenario); `--chunk-interval` spaces the
stream's events (long-streams scenario). GET /models and /healthz answer too.

`--tool-loop` (scenario 11, off by default so that the other scenarios' answers stay what they are): a request
with `"tools"` whose last message is a user message is answered with an assistant turn that carries
`reasoning_content` and one tool call (`call_<16 hex digits>`, unique per answer, finish_reason
"tool_calls"), streamed when asked; every other request gets the usual answer (a request whose last message
is the tool result: the normal content).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import re
import time
from collections import deque
from dataclasses import dataclass
from typing import cast

import httptools
import orjson
import uvloop

from bench.common import raise_nofile_limit

MODEL = "deepseek-flash"
ID_PLACEHOLDER = b"chatcmpl-0000000000000000"
CALL_PLACEHOLDER = b"call_0000000000000000"  # same length as b"call_%016x"
_STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')
_ROLE = re.compile(rb'"role"\s*:\s*"([a-z]+)"')
TOOL_NAME = "read_file"
TOOL_ARGUMENTS = '{"path":"app/forward.py","start_line":30,"end_line":60}'
# About 1.5 KB, the size of a short thinking-mode reasoning before a tool call: what restore_reasoning keeps.
TOOL_REASONING = (
    "The user wants to know where the upstream request is built and how streaming answers are relayed. "
    "The search earlier pointed at app/forward.py around line 41, but I have not read the surrounding code "
    "yet, so I cannot say whether the streaming branch buffers or relays raw bytes. Reading lines 30 to 60 "
    "will show the request construction, the headers passed along, and the branch that decides between a "
    "StreamingResponse and a buffered Response. "
) * 4


@dataclass(frozen=True)
class Config:
    delay_s: float
    chunks: int
    chunk_interval_s: float
    tool_loop: bool = False


def _usage(completion_tokens: int) -> dict[str, object]:
    return {
        "prompt_tokens": 1520,
        "completion_tokens": completion_tokens,
        "total_tokens": 1520 + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 1280},
        "prompt_cache_hit_tokens": 1280,
        "prompt_cache_miss_tokens": 240,
        "completion_tokens_details": {"reasoning_tokens": completion_tokens // 2},
    }


def completion_json() -> bytes:
    return orjson.dumps(
        {
            "id": ID_PLACEHOLDER.decode(),
            "object": "chat.completion",
            "created": 1760000000,
            "model": MODEL,
            "system_fingerprint": "fp_bench_v4",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": "The request is built in app/forward.py:41; streams are relayed raw.",
                        "reasoning_content": "The user asked where the request is built; search found it.",
                    },
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": _usage(42),
        }
    )


def _tool_call(index: int | None) -> dict[str, object]:
    call: dict[str, object] = {
        "id": CALL_PLACEHOLDER.decode(),
        "type": "function",
        "function": {"name": TOOL_NAME, "arguments": TOOL_ARGUMENTS},
    }
    return call if index is None else {"index": index, **call}


def tool_call_json() -> bytes:
    """A thinking-mode answer that ends in one tool call (what DeepSeek answers to a tool-using turn)."""
    return orjson.dumps(
        {
            "id": ID_PLACEHOLDER.decode(),
            "object": "chat.completion",
            "created": 1760000000,
            "model": MODEL,
            "system_fingerprint": "fp_bench_v4",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": "",
                        "reasoning_content": TOOL_REASONING,
                        "tool_calls": [_tool_call(None)],
                    },
                    "logprobs": None,
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": _usage(64),
        }
    )


def tool_stream_events(chunks: int) -> list[bytes]:
    """The streamed form: reasoning deltas, the call (id and name, then its arguments), then the
    `tool_calls` finish chunk carrying usage, and [DONE]."""

    def chunk(delta: dict[str, object], finish: str | None = None, usage: bool = False) -> bytes:
        obj: dict[str, object] = {
            "id": ID_PLACEHOLDER.decode(),
            "object": "chat.completion.chunk",
            "created": 1760000000,
            "model": MODEL,
            "system_fingerprint": "fp_bench_v4",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if usage:
            obj["usage"] = _usage(64)
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    parts = max(chunks - 2, 1)
    step = -(-len(TOOL_REASONING) // parts)
    events = [chunk({"role": "assistant", "content": None, "reasoning_content": ""})]
    for i in range(parts):
        events.append(chunk({"reasoning_content": TOOL_REASONING[i * step : (i + 1) * step]}))
    first = _tool_call(0)
    first["function"] = {"name": TOOL_NAME, "arguments": ""}
    events.append(chunk({"tool_calls": [first]}))
    events.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": TOOL_ARGUMENTS}}]}))
    events.append(chunk({}, finish="tool_calls", usage=True))
    events.append(b"data: [DONE]\n\n")
    return events


def stream_events(chunks: int) -> list[bytes]:
    """SSE events (each `data: ...\\n\\n`): `chunks` deltas (reasoning, then content), usage chunk, [DONE]."""

    def chunk(delta: dict[str, object], finish: str | None = None, usage: bool = False) -> bytes:
        obj: dict[str, object] = {
            "id": ID_PLACEHOLDER.decode(),
            "object": "chat.completion.chunk",
            "created": 1760000000,
            "model": MODEL,
            "system_fingerprint": "fp_bench_v4",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if usage:
            obj["usage"] = _usage(chunks)
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    events = [chunk({"role": "assistant", "content": None, "reasoning_content": ""})]
    for i in range(max(chunks - 1, 0)):
        if i < chunks // 2:
            events.append(chunk({"reasoning_content": f"thought {i} "}))
        else:
            events.append(chunk({"content": f"word {i} "}))
    events.append(chunk({"content": ""}, finish="stop", usage=True))
    events.append(b"data: [DONE]\n\n")
    return events


def _chunked(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


JSON_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n%s\r\n"
)
CLOSE_HDR = b"Connection: close\r\n"


class Responses:
    """Pre-built response bytes; per request only the completion id is substituted."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.ids = itertools.count(1)
        body = completion_json()
        self.json_keep = JSON_HEAD % (len(body), b"") + body
        self.json_close = JSON_HEAD % (len(body), CLOSE_HDR) + body
        self.events = [_chunked(e) for e in stream_events(cfg.chunks)]
        self.stream_tail = b"0\r\n\r\n"
        self.stream_keep = SSE_HEAD % b"" + b"".join(self.events) + self.stream_tail
        self.stream_close = SSE_HEAD % CLOSE_HDR + b"".join(self.events) + self.stream_tail
        models = orjson.dumps(
            {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "deepseek"}]}
        )
        self.models = JSON_HEAD % (len(models), b"") + models
        self.call_ids = itertools.count(1)
        tool = tool_call_json()
        self.tool_json_keep = JSON_HEAD % (len(tool), b"") + tool
        self.tool_json_close = JSON_HEAD % (len(tool), CLOSE_HDR) + tool
        self.tool_events = [_chunked(e) for e in tool_stream_events(cfg.chunks)]
        self.tool_stream_keep = SSE_HEAD % b"" + b"".join(self.tool_events) + self.stream_tail
        self.tool_stream_close = SSE_HEAD % CLOSE_HDR + b"".join(self.tool_events) + self.stream_tail
        missing = b'{"error":{"message":"not found","type":"invalid_request_error"}}'
        self.not_found = JSON_HEAD.replace(b"200 OK", b"404 Not Found") % (len(missing), b"") + missing

    def new_id(self) -> bytes:
        return b"chatcmpl-%016x" % next(self.ids)

    def new_call_id(self) -> bytes:
        return b"call_%016x" % next(self.call_ids)

    def answer(self, stream: bool, tool: bool, keep_alive: bool) -> bytes:
        """The whole response with a fresh completion id (and call id for a tool-call answer)."""
        if tool:
            if stream:
                raw = self.tool_stream_keep if keep_alive else self.tool_stream_close
            else:
                raw = self.tool_json_keep if keep_alive else self.tool_json_close
            return raw.replace(ID_PLACEHOLDER, self.new_id()).replace(CALL_PLACEHOLDER, self.new_call_id())
        if stream:
            raw = self.stream_keep if keep_alive else self.stream_close
        else:
            raw = self.json_keep if keep_alive else self.json_close
        return raw.replace(ID_PLACEHOLDER, self.new_id())


def _wants_stream(parts: list[bytes]) -> bool:
    """`"stream": true` in the body. Big bodies: only the first 8 KB and last 64 KB are searched (top-level
    scalars sit there; the bulk is `messages`), so a 4 MB body costs the upstream no full scan."""
    total = sum(len(p) for p in parts)
    if total <= 128 * 1024:
        return _STREAM_TRUE.search(b"".join(parts)) is not None
    head = parts[0][: 8 * 1024]
    tail_parts: list[bytes] = []
    need = 64 * 1024
    for part in reversed(parts):
        tail_parts.append(part[-need:])
        need -= len(tail_parts[-1])
        if need <= 0:
            break
    tail = b"".join(reversed(tail_parts))
    return _STREAM_TRUE.search(head) is not None or _STREAM_TRUE.search(tail) is not None


def _wants_tool_call(parts: list[bytes]) -> bool:
    """`--tool-loop`: the body declares tools and its last message is a user message. The last `"role": "…"`
    in the body is the last message's (tool definitions have no string-valued role; an escaped quote inside
    a string does not match)."""
    body = parts[0] if len(parts) == 1 else b"".join(parts)
    if b'"tools"' not in body:
        return False
    at = body.rfind(b'"role"')
    while at >= 0:
        found = _ROLE.match(body, at)
        if found is not None:
            return found.group(1) == b"user"
        at = body.rfind(b'"role"', 0, at)
    return False


class UpstreamProtocol(asyncio.Protocol):
    def __init__(self, responses: Responses) -> None:
        self.r = responses
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body_parts: list[bytes] = []
        self.busy = False
        self.pending: deque[tuple[bytes, bytes, bool, bool, bool]] = deque()

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports don't subclass it

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.write(
                    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
                self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.body_parts = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body_parts.append(body)

    def on_message_complete(self) -> None:
        method = self.parser.get_method()
        keep_alive = self.parser.should_keep_alive()
        stream = method == b"POST" and _wants_stream(self.body_parts)
        tool = self.r.cfg.tool_loop and method == b"POST" and _wants_tool_call(self.body_parts)
        self.body_parts = []
        item = (method, self.url, stream, keep_alive, tool)
        if self.busy:
            self.pending.append(item)
        else:
            self._dispatch(item)

    # responses
    def _dispatch(self, item: tuple[bytes, bytes, bool, bool, bool]) -> None:
        method, url, stream, keep_alive, tool = item
        path = url.split(b"?", 1)[0]
        cfg = self.r.cfg
        if method == b"POST" and path.endswith(b"/chat/completions"):
            if cfg.delay_s > 0 or (stream and cfg.chunk_interval_s > 0):
                self.busy = True
                asyncio.get_running_loop().create_task(self._slow(stream, keep_alive, tool))
                return
            self._write(self.r.answer(stream, tool, keep_alive), keep_alive)
        elif method == b"GET" and path.rstrip(b"/").endswith(b"/models"):
            self._write(self.r.models, keep_alive)
        elif method == b"GET" and path == b"/healthz":
            self._write(JSON_HEAD % (2, b"") + b"{}", keep_alive)
        else:
            self._write(self.r.not_found, keep_alive)

    def _write(self, raw: bytes, keep_alive: bool) -> None:
        if self.transport is None:
            return
        self.transport.write(raw)
        if not keep_alive:
            self.transport.close()

    async def _slow(self, stream: bool, keep_alive: bool, tool: bool) -> None:
        try:
            cfg = self.r.cfg
            if cfg.delay_s > 0:
                await asyncio.sleep(cfg.delay_s)
            if self.transport is None:
                return
            if not stream:
                self._write(self.r.answer(False, tool, keep_alive), keep_alive)
                return
            new_id = self.r.new_id()
            call_id = self.r.new_call_id() if tool else CALL_PLACEHOLDER
            head = SSE_HEAD % (b"" if keep_alive else CLOSE_HDR)
            loop = asyncio.get_running_loop()
            start = loop.time()
            for k, event in enumerate(self.r.tool_events if tool else self.r.events):
                if k:
                    await asyncio.sleep(max(0.0, start + k * cfg.chunk_interval_s - loop.time()))
                if self.transport is None:
                    return
                data = event.replace(ID_PLACEHOLDER, new_id)
                if tool:
                    data = data.replace(CALL_PLACEHOLDER, call_id)
                self.transport.write(head + data if k == 0 else data)
            self._write(self.r.stream_tail, keep_alive)
        finally:
            self.busy = False
            while self.pending and not self.busy and self.transport is not None:
                self._dispatch(self.pending.popleft())


async def serve(host: str, port: int, cfg: Config) -> None:
    responses = Responses(cfg)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: UpstreamProtocol(responses), host, port, backlog=8192, reuse_address=True
    )
    print(f"upstream listening on http://{host}:{port} {cfg}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description="fast fake DeepSeek upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument("--chunks", type=int, default=10, help="content chunks per stream")
    parser.add_argument("--chunk-interval", type=float, default=0.0, help="seconds between SSE events")
    parser.add_argument(
        "--tool-loop",
        action="store_true",
        help="answer a request with tools whose last message is a user message with a reasoning + tool call",
    )
    args = parser.parse_args()
    raise_nofile_limit()
    cfg = Config(
        delay_s=args.delay, chunks=args.chunks, chunk_interval_s=args.chunk_interval, tool_loop=args.tool_loop
    )
    started = time.time()
    try:
        uvloop.run(serve(args.host, args.port, cfg))
    except KeyboardInterrupt:
        pass
    finally:
        print(f"upstream stopped after {time.time() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
