"""Token counts from DeepSeek's `usage` object, and from a relayed SSE stream (§7)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class TokenCounts:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_cache_hit_tokens: int = 0
    prompt_cache_miss_tokens: int = 0
    reasoning_tokens: int = 0


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def tokens_from_usage(usage: Any) -> TokenCounts | None:
    """DeepSeek's fields, with OpenAI's spelling of the cache-hit count as fallback."""
    if not isinstance(usage, dict):
        return None
    prompt = _int(usage.get("prompt_tokens"))
    details = usage.get("prompt_tokens_details")
    hit = usage.get("prompt_cache_hit_tokens")
    if hit is None and isinstance(details, dict):
        hit = details.get("cached_tokens")
    hit_n = _int(hit)
    miss = usage.get("prompt_cache_miss_tokens")
    miss_n = _int(miss) if miss is not None else max(prompt - hit_n, 0)
    completion_details = usage.get("completion_tokens_details")
    reasoning = completion_details.get("reasoning_tokens") if isinstance(completion_details, dict) else None
    return TokenCounts(prompt, _int(usage.get("completion_tokens")), hit_n, miss_n, _int(reasoning))


def usage_from_body(body: bytes) -> tuple[bool, TokenCounts | None]:
    """(is JSON, tokens) for a non-streaming response body."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False, None
    return True, tokens_from_usage(data.get("usage")) if isinstance(data, dict) else None


COMPACT_AT = 16 * 1024  # per stream: 2,000 long streams hold at most ~32 MB of raw events


class StreamMeter:
    """Watches relayed SSE bytes: finds the chunk carrying `usage`, keeps the streamed text for estimates.

    Parsing happens in batches (when 16 KB have gathered, and once at the end), never per chunk; the text
    kept for an estimate is joined after each batch, so a long stream holds one string, not one per event.
    """

    __slots__ = ("_buf", "done", "ended_with_error", "events", "reasoning", "text", "usage")

    def __init__(self) -> None:
        self._buf = bytearray()
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.usage: TokenCounts | None = None
        self.done = False  # saw data: [DONE]
        self.ended_with_error = False  # the last event was an `error` object (DeepSeek's own)
        self.events = 0

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk
        if len(self._buf) > COMPACT_AT:
            self._drain(final=False)

    def finish(self) -> None:
        self._drain(final=True)

    def _drain(self, final: bool) -> None:
        data = bytes(self._buf)
        cut = len(data) if final else data.rfind(b"\n") + 1
        self._buf = bytearray(data[cut:])
        for line in data[:cut].split(b"\n"):
            if line.startswith(b"data:"):
                self._event(line[5:].strip())
        if len(self.text) > 1:
            self.text = ["".join(self.text)]
        if len(self.reasoning) > 1:
            self.reasoning = ["".join(self.reasoning)]

    def _event(self, payload: bytes) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if not isinstance(chunk, dict):
            return
        self.events += 1
        self.ended_with_error = "error" in chunk
        found = tokens_from_usage(chunk.get("usage"))
        if found is not None:
            self.usage = found
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if isinstance(delta, dict):
                self._collect(delta)

    def _collect(self, delta: dict[str, Any]) -> None:
        reasoning, content = delta.get("reasoning_content"), delta.get("content")
        if isinstance(reasoning, str) and reasoning:
            self.reasoning.append(reasoning)
        if isinstance(content, str) and content:
            self.text.append(content)
        for call in delta.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                self.text.extend(v for v in (fn.get("name"), fn.get("arguments")) if isinstance(v, str) and v)
