"""A fake DeepSeek chat-completions upstream for the test suite.

`create_fake_app(state)` returns a pure ASGI app that answers like api.deepseek.com (spec sections 5-7 of
docs/rules-chat.md and its sources): deterministic answers, DeepSeek-style usage, SSE streaming chunk by
chunk, DeepSeek error bodies and selectable faults. Everything that reaches it is recorded in `FakeState`.

Faults are chosen per request with the header `x-fake-fault: <name>` (`none` disables a global fault) or
globally with `FakeState.fault` (optionally limited to the next `fault_count` chat requests).
`x-fake-delay: <s>` overrides the delay of `slow`, `no_headers` and `stall_mid_stream`;
`x-fake-chunk-delay: <s>` overrides `chunk_delay` for one request.
A misbehaving upstream (chat): `x-fake-huge-line: <bytes>` makes a stream's first event, or a non-streaming
answer's JSON body, that many bytes longer (one line); `x-fake-endless: <bytes>` streams that many bytes of
content events after the first, then stops without usage.

Attempts (chatgate's retries): the attempts of one client request share its `x-request-id`. A fault applies
only to the first N attempts of a request with `x-fake-fault-attempts: N` (or `fault_attempts`), and the
global fault only to the share `fault_ratio` of requests (chosen by a hash of the id). `x-fake-retry-after`
(or `retry_after`) adds a Retry-After header to the error faults. An account key can be capped at N requests
in flight (`key_concurrency`: beyond it, DeepSeek's 429 concurrency text) or have no balance
(`no_balance_keys`: 402). With `fault_after_chunks = 0`, `reset_mid_stream` drops the connection after only
the keep-alives (of a stream, or the blank lines before a JSON body).

Chat bodies are checked like DeepSeek checks them (`chatgate.demo.rules`, written from the spec, not from the
product): a body DeepSeek refuses gets its 400. `FakeState.validate = False` turns that off (JSON objects
only). Every byte the fake writes back is recorded in `RecordedRequest.sent`. FIM and the balance are in
`chatgate.demo.fim`, the Files API in `chatgate.demo.files`.
"""

from __future__ import annotations

import asyncio
import base64
import re
import secrets
import string
import threading
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import orjson

from chatgate.demo.prefix_cache import PrefixCache
from chatgate.demo.rules import DESERIALIZE, deepseek_error, is_thinking, kind
from chatgate.demo.server_tools import (
    WebUse,
    chat_message_field,
    title_for,
    usage_field,
    wants_title,
    web_use,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MODEL_IDS = ("deepseek-flash", "deepseek-v4-pro")
CHAT_PATHS = frozenset({"/chat/completions", "/v1/chat/completions", "/beta/chat/completions"})
MODEL_PATHS = frozenset({"/models", "/v1/models"})
USAGE_MODES = ("last_chunk", "separate_when_asked")
SYSTEM_FINGERPRINT = "fp_fake0000_prod0000_fp8_kvcache"
INVALID = "invalid_request_error"
AUTH_ERROR = "authentication_error"

RATE_LIMIT_MESSAGE = (
    "Your current concurrency is 40, which exceeds your concurrency limit of 39 based on your remaining "
    "balance. Please top up your balance to restore your concurrency."
)
# status, message, type. Types of 429/500/503 are not documented anywhere: our guess.
ERROR_FAULTS: dict[str, tuple[int, str, str]] = {
    "http_400": (400, "Content Exists Risk", INVALID),
    "http_402": (402, "Insufficient Balance", "unknown_error"),
    "http_429": (429, RATE_LIMIT_MESSAGE, "rate_limit_error"),
    "http_500": (500, "Internal Server Error", "unknown_error"),
    "http_503": (503, "Server Overloaded: too much traffic, please retry later", "unknown_error"),
    # not in DeepSeek's error guide, but what a proxy in front of it (or a wrong path) answers: the retry
    # tests need each status chatgate retries or never retries
    "http_502": (502, "Bad Gateway", "unknown_error"),
    "http_504": (504, "Gateway Timeout", "unknown_error"),
    "http_403": (403, "Forbidden", "unknown_error"),
    "http_404": (404, "Not Found", INVALID),
    "http_413": (413, "Request Entity Too Large", INVALID),
}
BAD_GZIP = b"\x1f\x8b\x08\x00not gzip at all"
PLAIN_422 = f"{DESERIALIZE} missing field `messages` at line 4 column 1".encode()
STREAM_FAULTS = frozenset({"reset_mid_stream", "stall_mid_stream", "error_mid_stream"})
# the whole answer is sent, then the connection is dropped or left open (no end of the chunked body)
AFTER_END_FAULTS = frozenset({"reset_after_end", "stall_after_end"})
OTHER_FAULTS = frozenset({"http_401", "http_422", "non_json_200", "bad_gzip_200", "no_headers", "slow"})
FAULTS = frozenset(ERROR_FAULTS) | STREAM_FAULTS | AFTER_END_FAULTS | OTHER_FAULTS
CONFIG_FIELDS = (
    "usage_mode", "chunk_delay", "keepalive_count", "nonstream_keepalive_lines", "fault", "fault_count",
    "fault_after_chunks", "slow_delay", "hang_seconds", "error_content_type", "valid_keys", "validate",
    "tool_rounds", "tool_name", "tool_arguments",
    "fault_attempts", "fault_ratio", "retry_after", "key_concurrency", "no_balance_keys", "balance_currency",
    "prefix_cache", "bill_media", "accept_refusals", "refuse_bodies",
)  # fmt: skip
HTML_GARBAGE = b"<html><head><title>502 Bad Gateway</title></head><body><center>nginx</center></body></html>"


# ---------------------------------------------------------------------------------------------- records


@dataclass
class RecordedRequest:
    """One request that reached the fake (control endpoints excluded)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    auth_key: str | None
    request_id: str | None
    received_at: float = field(default_factory=time.time)
    stream: bool = False
    fault: str | None = None
    status: int | None = None
    usage: dict[str, Any] | None = None  # usage the fake computed for its answer (None for errors)
    usage_sent: bool = False  # the usage object itself reached the client
    completion_tokens_sent: int = 0  # tokens of the chunks/body actually written before the end or the cut
    outcome: str = "pending"  # pending|completed|error_response|client_disconnected|reset|stream_error
    refused: str | None = None  # DeepSeek's 400 message if the fake's validation refused the body
    sent: bytearray = field(default_factory=bytearray)  # every response body byte written, in order
    peer: tuple[str, int] | None = None  # the client's address: one per connection chatgate opened
    query: str = ""  # the query string, as sent
    attempt: int = 1  # the how-manyth request with this x-request-id

    @property
    def json(self) -> Any:
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return None

    @property
    def completed(self) -> bool:
        return self.outcome in ("completed", "error_response")

    @property
    def cut_short(self) -> bool:
        return self.outcome in ("client_disconnected", "reset", "stream_error")

    def issued(self) -> dict[str, Any]:
        return {
            "path": self.path, "auth_key": self.auth_key, "request_id": self.request_id,
            "stream": self.stream, "fault": self.fault, "status": self.status, "usage": self.usage,
            "usage_sent": self.usage_sent, "completion_tokens_sent": self.completion_tokens_sent,
            "outcome": self.outcome, "completed": self.completed, "cut_short": self.cut_short,
            "attempt": self.attempt,
        }  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {
            **self.issued(), "method": self.method, "headers": self.headers, "received_at": self.received_at,
            "body_b64": base64.b64encode(self.body).decode(), "json": self.json, "refused": self.refused,
            "sent_b64": base64.b64encode(bytes(self.sent)).decode(), "query": self.query,
        }  # fmt: skip


USAGE_SUM_KEYS = (
    "prompt_tokens", "completion_tokens", "total_tokens",
    "prompt_cache_hit_tokens", "prompt_cache_miss_tokens",
)  # fmt: skip


@dataclass
class FakeState:
    """Configuration (the CONFIG_FIELDS) and records of one fake DeepSeek. Thread-safe enough for tests."""

    usage_mode: str = "last_chunk"  # or "separate_when_asked"
    chunk_delay: float = 0.0  # seconds between streamed events (and non-stream keep-alive lines)
    keepalive_count: int = 1  # ": keep-alive" SSE comments before the first stream chunk
    nonstream_keepalive_lines: int = 0  # empty lines before a non-streaming JSON body
    fault: str | None = None  # global fault for chat requests (header x-fake-fault wins)
    fault_count: int | None = None  # apply the global fault to this many more chat requests; None = all
    fault_after_chunks: int = 3  # data chunks sent before reset/stall/error mid-stream
    slow_delay: float = 1.0  # seconds before headers for "slow"
    hang_seconds: float = 3600.0  # how long "no_headers" / "stall_mid_stream" hang
    error_content_type: str = "application/json"  # e.g. "application/octet-stream" as observed
    valid_keys: list[str] | None = None  # if set, only these keys authenticate
    validate: bool = True  # refuse chat bodies DeepSeek refuses (chatgate.demo.rules)
    # The tool loop of the Anthropic and Responses routes (ToolScript): the model calls a tool on this many
    # rounds after the user's last message, then answers with text; the tool it calls (if the request
    # defines it; else the first client tool) and its arguments as JSON text (else {"q": "x"}).
    tool_rounds: int = 1
    tool_name: str | None = None
    tool_arguments: str | None = None
    fault_attempts: int | None = None  # the fault applies to the first N attempts of a request only
    fault_ratio: float = 1.0  # the share of requests (by x-request-id) the global fault applies to
    retry_after: str | None = None  # a Retry-After header on the error faults
    key_concurrency: dict[str, int] = field(default_factory=dict)  # key -> requests in flight it may have
    no_balance_keys: list[str] = field(default_factory=list)  # keys whose account has run out of balance
    balance_currency: str = "USD"  # the currency /user/balance says the account holds (USD or CNY)
    prefix_cache: bool = False  # hits from a context cache like DeepSeek's (chatgate.demo.prefix_cache)
    cache: PrefixCache = field(default_factory=PrefixCache, repr=False)
    # chat bills as DeepSeek does what the body's bytes do not show: 384 tokens per image part, and an
    # uploaded file a part names at one token per byte of it (`media_tokens`)
    bill_media: bool = False
    # DeepSeek changing its mind (issue 47's tests): a refusal whose message carries one of `accept_refusals`
    # is not made (the body is accepted); a body carrying a key of `refuse_bodies` is refused with its value
    accept_refusals: list[str] = field(default_factory=list)
    refuse_bodies: dict[str, str] = field(default_factory=dict)
    requests: list[RecordedRequest] = field(default_factory=list)
    keep_requests: int | None = None  # keep only the newest N in `requests` (a long-running demo); None: all
    issued_usage: dict[str, dict[str, int]] = field(default_factory=dict)  # per Authorization key
    active: int = 0  # requests being handled right now
    peak_active: int = 0  # the most handled at once since the last reset
    files: dict[str, Any] = field(default_factory=dict)  # the Files API's store (chatgate.demo.files), by id
    attempts: dict[str, int] = field(default_factory=dict)  # requests seen per x-request-id
    key_active: dict[str, int] = field(default_factory=dict)  # requests in flight per key
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _defaults: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.configure(**self.config())  # validate the initial values
        self._defaults = self.config()

    def config(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in CONFIG_FIELDS}

    def configure(self, **values: Any) -> None:
        unknown = set(values) - set(CONFIG_FIELDS)
        if unknown:
            raise ValueError(f"unknown config fields: {sorted(unknown)}")
        if values.get("fault") is not None and values["fault"] not in FAULTS:
            raise ValueError(f"unknown fault {values['fault']!r}; known: {sorted(FAULTS)}")
        if "usage_mode" in values and values["usage_mode"] not in USAGE_MODES:
            raise ValueError(f"usage_mode must be one of {USAGE_MODES}")
        if "validate" in values and not isinstance(values["validate"], bool):
            raise ValueError("validate must be true or false")
        rounds = values.get("tool_rounds", 0)
        if not isinstance(rounds, int) or rounds < 0:
            raise ValueError("tool_rounds must be an integer >= 0")
        for name, value in values.items():
            setattr(self, name, value)

    def changed_mind(self, raw: bytes, body: dict[str, Any] | None, problem: str | None
                     ) -> tuple[dict[str, Any] | None, str | None]:
        """A body's check, `(body, problem)` as the family's parse gave it, with `accept_refusals` and
        `refuse_bodies` applied."""
        if problem is not None and any(words in problem for words in self.accept_refusals):
            parsed = orjson.loads(raw)
            return (parsed, None) if isinstance(parsed, dict) else (body, problem)
        if problem is None:
            text = raw.decode("utf-8", "replace")
            for needle, message in self.refuse_bodies.items():
                if needle in text:
                    return None, message
        return body, problem

    def reset(self) -> None:
        """Forget all records and restore the configuration the state was created with."""
        with self._lock:
            self.requests.clear()
            self.issued_usage.clear()
            self.files.clear()
            self.attempts.clear()
            self.peak_active = self.active
        self.cache.clear()
        self.configure(**self._defaults)

    def cached(self, rec: RecordedRequest, kind: str, body: dict[str, Any]) -> tuple[int, int] | None:
        """(prompt tokens, hits) from the context cache when `prefix_cache` is on, else None."""
        return self.cache.usage(rec.auth_key or "", kind, body) if self.prefix_cache else None

    def take_fault(self) -> str | None:
        with self._lock:
            if self.fault is None or self.fault_count == 0:
                return None
            if self.fault_count is not None:
                self.fault_count -= 1
            return self.fault

    def count_attempt(self, request_id: str | None) -> int:
        if request_id is None:
            return 1
        with self._lock:
            n = self.attempts[request_id] = self.attempts.get(request_id, 0) + 1
            return n

    def faulted(self, request_id: str | None) -> bool:
        """Whether the global fault is for this request (`fault_ratio` of them, by their id)."""
        if self.fault_ratio >= 1.0:
            return True
        digest = zlib.crc32((request_id or "").encode()) / 0xFFFFFFFF
        return digest < self.fault_ratio

    @contextmanager
    def key_slot(self, key: str) -> Iterator[bool]:
        """Whether the key's account may take one more request now (held until the answer ends)."""
        cap = self.key_concurrency.get(key)
        with self._lock:
            taken = self.key_active.get(key, 0)
            ok = cap is None or taken < cap
            if ok:
                self.key_active[key] = taken + 1
        try:
            yield ok
        finally:
            if ok:
                with self._lock:
                    self.key_active[key] -= 1

    def note_usage_sent(self, rec: RecordedRequest) -> None:
        rec.usage_sent = True
        if rec.usage is None:
            return
        with self._lock:
            totals = self.issued_usage.setdefault(rec.auth_key or "", {"requests": 0})
            totals["requests"] += 1
            for key in USAGE_SUM_KEYS:
                totals[key] = totals.get(key, 0) + int(rec.usage[key])
            reasoning = int(rec.usage["completion_tokens_details"]["reasoning_tokens"])
            totals["reasoning_tokens"] = totals.get("reasoning_tokens", 0) + reasoning

    def issued_report(self) -> dict[str, Any]:
        with self._lock:
            per_key = {key: dict(value) for key, value in self.issued_usage.items()}
            per_request = [rec.issued() for rec in self.requests]
        return {"per_key": per_key, "requests": per_request}

    @contextmanager
    def tracking(self) -> Iterator[None]:
        with self._lock:
            self.active += 1
            self.peak_active = max(self.peak_active, self.active)
        try:
            yield
        finally:
            with self._lock:
                self.active -= 1

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Block (test thread, never the server loop) until no request is in flight."""
        deadline = time.monotonic() + timeout
        while self.active and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.active == 0

    async def wait_idle_async(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.active and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return self.active == 0


# ---------------------------------------------------------------------------------------------- answers


@dataclass
class ToolCall:
    id: str
    name: str
    arg_pieces: list[str]


@dataclass
class Plan:
    """What the fake model "generates"; one piece = one completion token."""

    thinking: bool
    reasoning: list[str]
    content: list[str]
    tool_call: ToolCall | None
    finish_reason: str
    web: WebUse | None = None  # the server web tools it ran (chatgate.demo.server_tools)
    title: str | None = None  # with title: {"enabled": true}

    @property
    def completion_tokens(self) -> int:
        tool_tokens = 1 + len(self.tool_call.arg_pieces) if self.tool_call else 0
        return len(self.reasoning) + len(self.content) + tool_tokens


def split_pieces(text: str) -> list[str]:
    return re.findall(r"\s*\S+", text) or [text]


DEFAULT_TOOL_PIECES = ('{"q', '": "', 'x"}')  # the arguments {"q": "x"}, one output token each


@dataclass(frozen=True)
class ToolScript:
    """How the fake model runs a tool loop (FakeState's tool_rounds, tool_name, tool_arguments)."""

    rounds: int = 1
    name: str | None = None
    arguments: str | None = None

    @classmethod
    def of(cls, state: FakeState) -> ToolScript:
        return cls(state.tool_rounds, state.tool_name, state.tool_arguments)

    def pick(self, names: list[str]) -> str | None:
        """The tool to call among the request's client tools (in their order)."""
        if self.name is not None and self.name in names:
            return self.name
        return names[0] if names else None

    def pieces(self) -> list[str]:
        """The arguments as streamed pieces, one output token each."""
        if self.arguments is None:
            return list(DEFAULT_TOOL_PIECES)
        return [self.arguments[i:i + 8] for i in range(0, len(self.arguments), 8)] or ["{}"]


def random_tool_call_id() -> str:
    alphabet = string.ascii_letters + string.digits
    return "call_00_" + "".join(secrets.choice(alphabet) for _ in range(24))


def wants_tool_call(body: dict[str, Any], last: dict[str, Any]) -> str | None:
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not isinstance(tools, list) or not tools or last.get("role") != "user" or choice == "none":
        return None
    named = choice.get("function") if isinstance(choice, dict) else None
    functions = [t["function"] for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)]
    if not isinstance(named, dict) and not functions:
        return None  # only server tools: DeepSeek runs them itself
    function = named if isinstance(named, dict) else functions[0]
    return str(function.get("name", "tool"))


def message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def answer_text(body: dict[str, Any], messages: list[Any], last: dict[str, Any]) -> str:
    n = len(messages)
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_object":
        return f'{{"answer": "Answer {n}", "ok": true}}'
    if last.get("role") == "tool":
        return f"Answer {n}: the tool said {message_text(last)}"
    return f"Answer {n}: the fake DeepSeek says hello."


def make_plan(body: dict[str, Any]) -> Plan:
    raw_messages = body.get("messages")
    messages: list[Any] = raw_messages if isinstance(raw_messages, list) else []
    last: dict[str, Any] = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    thinking = is_thinking(body)
    reasoning = split_pieces(f"The user sent {len(messages)} messages; I will answer.") if thinking else []
    tool_name = wants_tool_call(body, last)
    title = title_for(message_text(messages[0]) if messages and isinstance(messages[0], dict) else "") \
        if wants_title(body) else None
    if tool_name is not None:
        call = ToolCall(random_tool_call_id(), tool_name, ['{"q', '": "', 'x"}'])
        return Plan(thinking, reasoning, [], call, "tool_calls", title=title)
    web = web_use(body.get("tools"), message_text(last) if last.get("role") == "user" else None)
    content = split_pieces(answer_text(body, messages, last))
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, int) and 0 <= max_tokens < len(content):
        return Plan(thinking, reasoning, content[:max_tokens], None, "length", web, title)
    return Plan(thinking, reasoning, content, None, "stop", web, title)


def make_usage(raw_body: bytes, plan: Plan, cached: tuple[int, int] | None = None) -> dict[str, Any]:
    prompt, hit = cached if cached is not None else (len(raw_body) // 4 + 1, (len(raw_body) // 4 + 1) // 3)
    completion = plan.completion_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": hit},
        "prompt_cache_hit_tokens": hit,
        "prompt_cache_miss_tokens": prompt - hit,
        "completion_tokens_details": {"reasoning_tokens": len(plan.reasoning)},
        **(usage_field(plan.web) if plan.web is not None else {}),
    }


def media_tokens(body: dict[str, Any], files: dict[str, Any]) -> int:
    """What images (384 each) and named uploaded files (a token per byte) add to a chat's prompt, read from
    the parsed messages (as DeepSeek reads them: an escaped `\\u0069mage_url` is an image)."""
    tokens = 0
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else []:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "image_url":
                tokens += 384
            elif kind == "file":
                ref = part.get("file") if isinstance(part.get("file"), dict) else part
                stored = files.get(ref.get("file_id"))
                tokens += len(stored.content) if stored is not None else 0
    return tokens


def add_prompt_tokens(usage: dict[str, Any], extra: int) -> None:
    usage["prompt_tokens"] += extra
    usage["total_tokens"] += extra
    usage["prompt_cache_miss_tokens"] += extra


def response_base(body: dict[str, Any], obj: str) -> dict[str, Any]:
    return {
        "id": str(uuid.uuid4()),
        "object": obj,
        "created": int(time.time()),
        "model": str(body.get("model") or "deepseek-flash"),
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }


def completion_body(body: dict[str, Any], plan: Plan, usage: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": "".join(plan.content)}
    if plan.thinking:
        message["reasoning_content"] = "".join(plan.reasoning)
    if plan.web is not None:
        message.update(chat_message_field(plan.web))
    if plan.title is not None:
        message["title"] = plan.title
    if plan.tool_call:
        call = plan.tool_call
        function = {"name": call.name, "arguments": "".join(call.arg_pieces)}
        message["tool_calls"] = [{"index": 0, "id": call.id, "type": "function", "function": function}]
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": plan.finish_reason}
    return {**response_base(body, "chat.completion"), "choices": [choice], "usage": usage}


# ---------------------------------------------------------------------------------------------- streaming


@dataclass
class Event:
    data: bytes
    tokens: int = 0
    carries_usage: bool = False


def sse(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def plan_deltas(plan: Plan) -> Iterator[dict[str, Any]]:
    """Deltas after the role chunk, one per completion token."""
    for piece in plan.reasoning:
        yield {"content": None, "reasoning_content": piece}
    for piece in plan.content:
        yield {"content": piece, "reasoning_content": None} if plan.thinking else {"content": piece}
    if plan.tool_call:
        call = plan.tool_call
        function = {"name": call.name, "arguments": ""}
        yield {"tool_calls": [{"index": 0, "id": call.id, "type": "function", "function": function}]}
        for piece in call.arg_pieces:
            yield {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}


def stream_events(body: dict[str, Any], plan: Plan, usage: dict[str, Any], usage_mode: str) -> list[Event]:
    base = response_base(body, "chat.completion.chunk")
    options = body.get("stream_options")
    asked = isinstance(options, dict) and options.get("include_usage") is True
    separate = usage_mode == "separate_when_asked"
    extra: dict[str, Any] = {"usage": None} if separate and asked else {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**base, "choices": [choice], **extra}

    first = {"role": "assistant", "content": None, "reasoning_content": ""} if plan.thinking else None
    events = [Event(sse(chunk(first or {"role": "assistant", "content": ""})))]
    if plan.web is not None:
        events.append(Event(sse(chunk(chat_message_field(plan.web)))))
    events += [Event(sse(chunk(delta)), tokens=1) for delta in plan_deltas(plan)]
    last = {"content": ""} if plan.title is None else {"content": "", "title": plan.title}
    final = chunk(last, plan.finish_reason)
    if not separate:
        events.append(Event(sse({**final, "usage": usage}), carries_usage=True))
    else:
        events.append(Event(sse(final)))
        if asked:
            events.append(Event(sse({**base, "choices": [], "usage": usage}), carries_usage=True))
    return events


# ---------------------------------------------------------------------------------------------- plumbing


class Conn:
    """ASGI send side plus a watcher that notices the client going away."""

    def __init__(self, receive: Receive, send: Send, sent: bytearray) -> None:
        self._send = send
        self.sent = sent
        self.disconnected = asyncio.Event()
        self._watcher = asyncio.create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.disconnected.set()

    def close(self) -> None:
        self._watcher.cancel()

    async def start(self, status: int, headers: dict[str, str]) -> None:
        raw = [(k.encode(), v.encode()) for k, v in {**headers, "x-ds-trace-id": uuid.uuid4().hex}.items()]
        await self._send({"type": "http.response.start", "status": status, "headers": raw})

    async def body(self, data: bytes, more: bool = True) -> None:
        self.sent += data
        await self._send({"type": "http.response.body", "body": data, "more_body": more})

    async def respond(self, status: int, data: bytes, content_type: str,
                      headers: dict[str, str] | None = None) -> None:
        await self.start(status, {"content-type": content_type, "content-length": str(len(data)),
                                  **(headers or {})})
        await self.body(data, more=False)

    async def sleep(self, seconds: float) -> bool:
        """Sleep; return True (early) if the client disconnected."""
        if seconds <= 0:
            return self.disconnected.is_set()
        try:
            await asyncio.wait_for(self.disconnected.wait(), seconds)
        except TimeoutError:
            return False
        return True


async def read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


def header_dict(scope: Scope) -> dict[str, str]:
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", []):
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def bearer_key(headers: dict[str, str]) -> str | None:
    auth = headers.get("authorization", "")
    return auth[7:].strip() if auth[:7].lower() == "bearer " else None


def error_bytes(message: str, error_type: str) -> bytes:
    error = {"message": message, "type": error_type, "param": None, "code": "invalid_request_error"}
    return orjson.dumps({"error": error})


def with_server_tool_use(usage: dict[str, Any], rec: RecordedRequest) -> dict[str, Any]:
    """The usage of a chat, Messages or Responses answer with the searches and page reads the model made, as
    a test asks for them (`x-fake-server-tool-use: {"web_search_requests": 2, "web_fetch_requests": 1}`):
    the stand-in for the server web tools' report (Anthropic's `usage.server_tool_use`)."""
    asked = rec.headers.get("x-fake-server-tool-use")
    return {**usage, "server_tool_use": orjson.loads(asked)} if asked else usage


def auth_error(headers: dict[str, str], state: FakeState) -> bytes | None:
    key = bearer_key(headers)
    if key is None:
        return error_bytes("Authentication Fails (auth header format should be Bearer sk-...)", AUTH_ERROR)
    unknown = state.valid_keys is not None and key not in state.valid_keys
    return invalid_key_error(key) if not key or key.startswith("sk-bad") or unknown else None


def invalid_key_error(key: str) -> bytes:
    return error_bytes(f"Authentication Fails, Your api key: ****{key[-4:]} is invalid", AUTH_ERROR)


def header_float(headers: dict[str, str], name: str, default: float) -> float:
    try:
        return float(headers[name])
    except (KeyError, ValueError):
        return default


def parse_chat_body(path: str, raw: bytes, validate: bool) -> tuple[dict[str, Any] | None, str | None]:
    """(body, None) or (None, DeepSeek's 400 message)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return None, f"Failed to parse the request body as JSON: {exc}"
    if not isinstance(body, dict):
        return None, f"{DESERIALIZE} invalid type: {kind(body)}, expected a map at line 1 column 1"
    problem = deepseek_error(path, body, len(raw)) if validate else None
    return (None, problem) if problem else (body, None)


# ---------------------------------------------------------------------------------------------- the app


@dataclass(frozen=True)
class Route:
    """Paths another module of the fake answers (FIM, Files, tools, Anthropic, Responses), ahead of chat."""

    owns: Callable[[str], bool]
    serve: Callable[[FakeDeepSeek, RecordedRequest, Conn], Awaitable[None]]


class FakeDeepSeek:
    """The ASGI app; `chatgate.demo.app.create_fake_app` is the public constructor (with every route)."""

    def __init__(self, state: FakeState, routes: tuple[Route, ...] = ()) -> None:
        self.state = state
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        if scope["path"].startswith("/_fake/"):
            await self.control(scope, body, send)
            return
        headers = header_dict(scope)
        rec = RecordedRequest(
            scope["method"], scope["path"], headers, body, bearer_key(headers), headers.get("x-request-id")
        )
        client = scope.get("client")
        rec.peer = (client[0], client[1]) if client else None
        rec.query = scope.get("query_string", b"").decode("latin-1")
        rec.attempt = self.state.count_attempt(rec.request_id)
        self.state.requests.append(rec)
        if self.state.keep_requests is not None and len(self.state.requests) > self.state.keep_requests:
            del self.state.requests[:-self.state.keep_requests]
        conn = Conn(receive, send, rec.sent)
        try:
            with self.state.tracking():
                await self.route(rec, conn)
        finally:
            conn.close()

    async def route(self, rec: RecordedRequest, conn: Conn) -> None:
        for route in self.routes:
            if route.owns(rec.path):
                await route.serve(self, rec, conn)
                return
        denied = auth_error(rec.headers, self.state)
        if rec.path in CHAT_PATHS and rec.method == "POST" and denied is None:
            await self.chat(rec, conn)
        elif rec.path in MODEL_PATHS and rec.method == "GET" and denied is None:
            data = [{"id": model, "object": "model", "owned_by": "deepseek"} for model in MODEL_IDS]
            await self.send_json(rec, conn, 200, orjson.dumps({"object": "list", "data": data}))
        elif denied is not None and rec.path in CHAT_PATHS | MODEL_PATHS:
            await self.send_error(rec, conn, 401, denied)
        else:
            known = rec.path in CHAT_PATHS | MODEL_PATHS
            status, message = (405, "Method Not Allowed") if known else (404, "Not Found")
            await self.send_error(rec, conn, status, error_bytes(message, INVALID))

    async def send_json(self, rec: RecordedRequest, conn: Conn, status: int, data: bytes) -> None:
        rec.status, rec.outcome = status, "completed"
        await conn.respond(status, data, "application/json")

    async def send_error(self, rec: RecordedRequest, conn: Conn, status: int, data: bytes,
                         headers: dict[str, str] | None = None) -> None:
        rec.status, rec.outcome = status, "error_response"
        await conn.respond(status, data, self.state.error_content_type, headers)

    def pick_fault(self, rec: RecordedRequest) -> str | None:
        requested = rec.headers.get("x-fake-fault")
        limit = rec.headers.get("x-fake-fault-attempts")
        attempts = int(limit) if limit is not None else self.state.fault_attempts
        if attempts is not None and rec.attempt > attempts:
            return None
        if requested is not None:
            return None if requested in ("", "none") else requested
        if not self.state.faulted(rec.request_id):
            return None
        return self.state.take_fault()

    async def chat(self, rec: RecordedRequest, conn: Conn) -> None:
        await self.fault_or_answer(rec, conn, lambda fault: self.answer(rec, conn, fault))

    async def fault_or_answer(self, rec: RecordedRequest, conn: Conn,
                              answer: Callable[[str | None], Awaitable[None]]) -> None:
        """How every route starts (chat, FIM, Anthropic, Responses): the request's fault, else `answer`."""
        parsed = rec.json
        rec.stream = isinstance(parsed, dict) and parsed.get("stream") is True
        key = rec.auth_key or ""
        if key in self.state.no_balance_keys:
            await self.send_error(rec, conn, 402, error_bytes("Insufficient Balance", "unknown_error"))
            return
        with self.state.key_slot(key) as admitted:
            if not admitted:
                await self.send_error(rec, conn, 429, error_bytes(RATE_LIMIT_MESSAGE, "rate_limit_error"))
                return
            await self._fault_or_answer(rec, conn, answer)

    async def _fault_or_answer(self, rec: RecordedRequest, conn: Conn,
                               answer: Callable[[str | None], Awaitable[None]]) -> None:
        fault = rec.fault = self.pick_fault(rec)
        if fault is not None and fault not in FAULTS:
            message = error_bytes(f"fake: unknown x-fake-fault {fault!r}", INVALID)
            await self.send_error(rec, conn, 400, message)
        elif fault in ERROR_FAULTS or fault in ("http_401", "http_422"):
            await self.error_fault(rec, conn, fault)
        elif await self.hang_before_headers(rec, conn, fault):
            rec.outcome = "client_disconnected"
        else:
            await answer(fault)

    async def error_fault(self, rec: RecordedRequest, conn: Conn, fault: str) -> None:
        if fault == "http_401":
            await self.send_error(rec, conn, 401, invalid_key_error(rec.auth_key or ""))
        elif fault == "http_422":
            rec.status, rec.outcome = 422, "error_response"
            await conn.respond(422, PLAIN_422, "text/plain; charset=utf-8")
        else:
            status, message, error_type = ERROR_FAULTS[fault]
            after = rec.headers.get("x-fake-retry-after", self.state.retry_after)
            extra = {"retry-after": after} if after is not None else {}
            await self.send_error(rec, conn, status, error_bytes(message, error_type), extra)

    async def hang_before_headers(self, rec: RecordedRequest, conn: Conn, fault: str | None) -> bool:
        if fault == "slow":
            return await conn.sleep(header_float(rec.headers, "x-fake-delay", self.state.slow_delay))
        if fault == "no_headers":
            return await conn.sleep(header_float(rec.headers, "x-fake-delay", self.state.hang_seconds))
        return False

    async def answer(self, rec: RecordedRequest, conn: Conn, fault: str | None) -> None:
        body, problem = self.state.changed_mind(rec.body, *parse_chat_body(rec.path, rec.body,
                                                                           self.state.validate))
        if body is None:
            rec.refused = problem
            await self.send_error(rec, conn, 400, error_bytes(problem or "Invalid request", INVALID))
            return
        plan = make_plan(body)
        usage = make_usage(rec.body, plan, self.state.cached(rec, "chat", body))
        if self.state.bill_media:
            add_prompt_tokens(usage, media_tokens(body, self.state.files))
        rec.usage = with_server_tool_use(usage, rec)
        rec.status = 200
        if fault == "non_json_200":
            rec.outcome = "completed"
            await conn.respond(200, HTML_GARBAGE, "text/html; charset=utf-8")
        elif fault == "bad_gzip_200":  # says gzip, is not
            rec.outcome = "completed"
            await conn.start(200, {"content-type": "application/json", "content-encoding": "gzip",
                                   "content-length": str(len(BAD_GZIP))})
            await conn.body(BAD_GZIP, more=False)
        elif rec.stream:
            await self.stream(rec, conn, stream_events(body, plan, rec.usage, self.state.usage_mode), fault)
        else:
            answer = completion_body(body, plan, rec.usage)
            if huge := int(rec.headers.get("x-fake-huge-line", "0")):
                answer["pad"] = "x" * huge
            await self.nonstream(rec, conn, orjson.dumps(answer), plan, fault)

    async def stream(self, rec: RecordedRequest, conn: Conn, events: list[Event], fault: str | None) -> None:
        delay = header_float(rec.headers, "x-fake-chunk-delay", self.state.chunk_delay)
        cut_at = min(self.state.fault_after_chunks, len(events) - 2) if fault in STREAM_FAULTS else -1
        headers = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}
        await conn.start(200, headers)
        for index in range(self.state.keepalive_count):
            if index and await conn.sleep(delay):
                rec.outcome = "client_disconnected"
                return
            await conn.body(b": keep-alive\n\n")
        if await self.misbehave(rec, conn):
            return
        for index, event in enumerate(events):
            if index == cut_at and await self.stream_fault(rec, conn, fault):
                return
            if await conn.sleep(delay if index or self.state.keepalive_count else 0):
                rec.outcome = "client_disconnected"
                return
            await self.send_event(rec, conn, event)
        end_delay = header_float(rec.headers, "x-fake-end-delay", 0.0)  # the body's end comes apart
        await conn.body(b"data: [DONE]\n\n", more=fault in AFTER_END_FAULTS or end_delay > 0)
        rec.outcome = "completed"
        if end_delay > 0 and fault not in AFTER_END_FAULTS and not await conn.sleep(end_delay):
            await conn.body(b"", more=False)
        if fault == "stall_after_end":
            await conn.sleep(header_float(rec.headers, "x-fake-delay", self.state.hang_seconds))

    async def misbehave(self, rec: RecordedRequest, conn: Conn) -> bool:
        """`x-fake-huge-line` (an event of one long line) and `x-fake-endless` (content without end); True
        when the stream is over."""
        huge = int(rec.headers.get("x-fake-huge-line", "0"))
        piece = 64 * 1024
        if huge:
            await conn.body(b'data: {"choices":[],"pad":"')
            for _ in range(0, huge, piece):
                await conn.body(b"x" * piece)
            await conn.body(b'"}\n\n')
        endless = int(rec.headers.get("x-fake-endless", "0"))
        if not endless:
            return False
        event = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"y" * piece + b'"}}]}\n\n'
        for _ in range(0, endless, piece):
            if conn.disconnected.is_set():
                rec.outcome = "client_disconnected"
                return True
            await conn.body(event)
        await conn.body(b"", more=False)
        rec.outcome = "completed"
        return True

    async def send_event(self, rec: RecordedRequest, conn: Conn, event: Event) -> None:
        await conn.body(event.data)
        rec.completion_tokens_sent += event.tokens
        if event.carries_usage:
            self.state.note_usage_sent(rec)

    async def stream_fault(self, rec: RecordedRequest, conn: Conn, fault: str | None) -> bool:
        """Apply a mid-stream fault; True if the stream is over."""
        if fault == "reset_mid_stream":
            rec.outcome = "reset"  # returning without more_body=False makes uvicorn drop the connection
            return True
        if fault == "error_mid_stream":
            error = orjson.loads(error_bytes("Internal Server Error", "unknown_error"))
            await conn.body(sse(error), more=False)
            rec.outcome = "stream_error"
            return True
        if await conn.sleep(header_float(rec.headers, "x-fake-delay", self.state.hang_seconds)):
            rec.outcome = "client_disconnected"
            return True
        return False

    async def nonstream(
        self, rec: RecordedRequest, conn: Conn, data: bytes, plan: Plan, fault: str | None
    ) -> None:
        lines = self.state.nonstream_keepalive_lines
        headers = {"content-type": "application/json"}
        if not lines:
            headers["content-length"] = str(len(data))
        await conn.start(200, headers)
        for index in range(lines):
            if index and await conn.sleep(self.state.chunk_delay):
                rec.outcome = "client_disconnected"
                return
            await conn.body(b"\n")
        if fault in STREAM_FAULTS and await self.nonstream_fault(rec, conn, data, fault):
            return
        await conn.body(data, more=False)
        rec.completion_tokens_sent = plan.completion_tokens
        rec.outcome = "completed"
        self.state.note_usage_sent(rec)

    async def nonstream_fault(self, rec: RecordedRequest, conn: Conn, data: bytes, fault: str | None) -> bool:
        """Send half the body (none with fault_after_chunks = 0), then reset or stall. True if the response
        is over."""
        half = len(data) // 2 if self.state.fault_after_chunks else 0
        await conn.body(data[:half])
        if fault != "stall_mid_stream":
            rec.outcome = "reset"
            return True
        if await conn.sleep(header_float(rec.headers, "x-fake-delay", self.state.hang_seconds)):
            rec.outcome = "client_disconnected"
            return True
        await conn.body(data[half:], more=False)
        rec.outcome = "completed"
        self.state.note_usage_sent(rec)
        return True

    # ------------------------------------------------------------------------------------------ control

    async def control(self, scope: Scope, body: bytes, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        query = parse_qs(scope.get("query_string", b"").decode())
        wait = float(query.get("wait_idle", ["0"])[0])
        if wait > 0:
            await self.state.wait_idle_async(wait)
        status, payload = self.control_result(path, method, body)
        data = orjson.dumps(payload)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    def control_result(self, path: str, method: str, body: bytes) -> tuple[int, Any]:
        if path == "/_fake/requests" and method == "GET":
            return 200, [rec.to_json() for rec in list(self.state.requests)]
        if path == "/_fake/issued" and method == "GET":
            return 200, self.state.issued_report()
        if path == "/_fake/reset" and method == "POST":
            self.state.reset()
            return 200, {"ok": True, "config": self.state.config()}
        if path == "/_fake/config" and method == "GET":
            return 200, self.state.config()
        if path == "/_fake/config" and method == "POST":
            return self.set_config(body)
        return 404, {"error": f"no control endpoint {method} {path}"}

    def set_config(self, body: bytes) -> tuple[int, Any]:
        try:
            values = orjson.loads(body or b"{}")
            self.state.configure(**values)
        except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
            return 400, {"error": str(exc)}
        return 200, self.state.config()


async def lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return

