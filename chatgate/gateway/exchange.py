"""One request through the gateway, from arrival to its usage record."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from chatgate.confirmation.service import Watch
from chatgate.errors import MODEL_MAX_CHARS, APIError
from chatgate.gateway.auth import Identity
from chatgate.gateway.family import ToolRoute
from chatgate.gateway.retry import Tries
from chatgate.gateway.upstream import Answer, response_headers
from chatgate.metering.cache import PromptShape, Sketch
from chatgate.quotas.model import Admission, RateInfo
from chatgate.repair.base import Repaired
from chatgate.runs.tracker import Mark, Round
from chatgate.tracing.spans import ExchangeTrace
from chatgate.verdict import Verdict


@dataclass(frozen=True, slots=True)
class Route:
    label: str  # the route in records, metrics and logs
    upstream_path: str
    beta: bool = False
    tool: ToolRoute | None = None  # a tool API's route (chatgate/tools/)
    prompt: PromptShape | None = None  # how the cache advisor cuts its requests into parts (the family's)
    history: str | None = None  # how agent runs read its requests' history (the family's); None: no runs


@dataclass(slots=True)
class Exchange:
    route: Route
    request_id: str
    identity: Identity
    ts: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.perf_counter)
    body: bytes = b""
    model: str = "unknown"
    # The model it is priced as until DeepSeek names the one it served: its profile's (on the Messages route
    # a claude-* name is served by a DeepSeek model); "": `model`.
    priced_as: str = ""
    stream: bool = False
    ttfb_ms: float | None = None
    finished: bool = False
    completion_text: str | None = None  # kept only when server.log_content is on
    warnings: list[str] = field(default_factory=list)  # sent back as x-chatgate-warning
    repaired: Repaired | None = None  # the body was repaired: x-chatgate-repaired, the usage record
    remember: bool = False  # remember the answer's tool-call turn (thinking mode, tools, a known caller)
    admission: Admission | None = None  # the request's reservations against its limits, settled at the end
    trace: ExchangeTrace | None = None  # its spans, when tracing is on (chatgate.tracing)
    run: Round | Mark | None = None  # its part in an agent run (chatgate/runs/)
    # its attempts upstream and the account of the last one (chatgate/gateway/retry.py)
    tries: Tries | None = None
    checked: object = None  # the family's validated request (Verdict.request), for the cache advisor's parts
    files: bool = False  # it names uploaded files: the pool sends it to the account that holds them
    model_length: int = 0  # the length of a model name too long to keep (then a 400: errors.model_too_long)
    # what its images and documents add to its prompt (chatgate/gateway/media.py)
    media_tokens: int | None = None
    # R1's parse of `body` (chatgate/gateway/checking.py `Checked`): the advisor's items
    parsed: object = None
    sketch: Sketch | None = None  # the cache advisor's parts of the request, taken as it is forwarded
    # what its answer is evidence about (chatgate/confirmation/): forwarded to confirm a refusal, or with a
    # rule's warning; the refusal a confirmed 4xx answers with; its record's note (a rule DeepSeek disputed)
    watch: Watch | None = None
    refusal: APIError | None = None
    rule_note: str | None = None
    _json: dict[str, Any] | None = None

    @property
    def tool(self) -> str | None:
        """The tool API this request calls, if any (its name: the record's model)."""
        return self.route.tool.name if self.route.tool is not None else None

    def json(self) -> dict[str, Any]:
        """The body as a dict, parsed once and only when a step needs it ({} when it is not an object)."""
        if self._json is None:
            self._json = peek(self.body)
        return self._json

    def replace_body(self, body: bytes, data: dict[str, Any] | None) -> None:
        self.body, self._json, self.parsed = body, data, None

    def release(self) -> None:
        """Let go of what the checks made of the body before the upstream call, rather than hold it until
        the exchange ends: a 6 KB body's validated request and parses are thousands of objects, and holding
        them through the wait costs CPU (docs/performance.md). A later step that needs the body as a dict
        parses it again (`json`)."""
        self._json = self.parsed = self.checked = None

    def own_parse(self) -> object:
        """A parse of `body` made already, its objects' keys in the body's order (None: none was made)."""
        return self._json if self._json is not None else self.parsed

    def describe(self, verdict: Verdict | None) -> None:
        """The model and the stream flag it is metered by, as the family's check read them (without one,
        as the body says), and the model it is priced as. A model name over MODEL_MAX_CHARS is kept cut, its
        length in `model_length`."""
        profile = None
        if verdict is not None and verdict.model is not None:
            model, self.stream, profile = verdict.model, verdict.stream, verdict.profile
        else:
            model = self.json().get("model", "unknown")
            model = model if isinstance(model, str) else "unknown"
            if verdict is None:
                self.stream = self.json().get("stream") is True
        if len(model) > MODEL_MAX_CHARS:
            self.model_length, model = len(model), model[:MODEL_MAX_CHARS]
        self.model = model
        self.priced_as = profile.name if profile is not None else model

    @property
    def attempts(self) -> int:
        return self.tries.attempts if self.tries is not None else 1

    def response_headers(self, answer: Answer) -> list[tuple[bytes, bytes]]:
        headers = response_headers(answer.raw_headers, self.request_id)
        if self.warnings:
            headers.append((b"x-chatgate-warning", header_text(self.warnings)))
        if self.repaired is not None and self.repaired.applied:
            headers.append((b"x-chatgate-repaired", header_text(self.repaired.labels(), "; ")))
        if self.attempts > 1:
            headers.append((b"x-chatgate-attempts", str(self.attempts).encode()))
        return headers

    @property
    def rate_headers(self) -> RateInfo | None:
        """The caller's x-ratelimit headers (chatgate/gateway/responses.py `response_start` adds them)."""
        return self.admission.info if self.admission is not None else None

    def mark_first_byte(self) -> None:
        if self.ttfb_ms is None:
            self.ttfb_ms = (time.perf_counter() - self.t0) * 1000

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1000


# A client's text (a model name) may hold control characters, which uvicorn refuses in a header value once
# the answer is on its way; and Node's fetch refuses response headers over 16 KB in all.
_PRINTABLE = {c: " " for c in (*range(0x20), 0x7F)}
HEADER_MAX = 4096


def header_text(parts: list[str], sep: str = " | ", limit: int = HEADER_MAX) -> bytes:
    """`parts` joined with `sep` as one printable ASCII header value of at most about `limit` bytes; what
    does not fit is counted (POST …/validate lists them all)."""
    value = sep.join(parts).translate(_PRINTABLE).encode("ascii", "replace")
    if len(value) <= limit:
        return value
    kept: list[bytes] = []
    size = 0
    for part in parts:
        text = part.translate(_PRINTABLE).encode("ascii", "replace")
        if size + len(text) + len(sep) > limit - 64:
            break
        kept.append(text)
        size += len(text) + len(sep)
    left = len(parts) - len(kept)
    return sep.encode().join([*kept, f"(+{left} more: POST .../validate lists them all)".encode()])


def peek(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}
