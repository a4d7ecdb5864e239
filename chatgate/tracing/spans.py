"""The spans of one request: its SERVER span and a CLIENT span per upstream attempt, with the
OpenTelemetry semantic conventions v1.44.0 for HTTP and for GenAI (`gen_ai.*`, as in
opentelemetry-semantic-conventions 0.66b2: `gen_ai.provider.name`, `gen_ai.usage.cache_read.input_tokens`,
`gen_ai.usage.reasoning.output_tokens`, `gen_ai.response.time_to_first_chunk`; docs/observability.md).

The gateway holds an `ExchangeTrace` per request (None when tracing is off, so every hook is one `is not
None` test). On the request path it records only ids, times and references to what the request has anyway
(its usage record, the answer's id, model and finish reasons); a sampled one is handed as it is to the
export queue when the request ends (one object a request), and the queue's thread makes its spans and
encodes them (chatgate.tracing.queue, chatgate.tracing.lean). An unsampled one still sends its trace context
on. The retry engine calls `start_attempt` before each upstream attempt and `attempt_failed` for one it gives
up on; the last attempt ends with the request (`finish`), when its usage is known.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from chatgate.bounded import BoundedDict
from chatgate.store.base import UsageRecord
from chatgate.tracing.counts import TraceCollector, TraceCounts
from chatgate.tracing.lean import FIXED_MAX, MASK64, Failed, Fixed
from chatgate.tracing.queue import ExportQueue

PROVIDER = "deepseek"
TRACE_HEADERS = (b"traceparent", b"tracestate")
_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,200})"')
_MODEL = re.compile(rb'"model"\s*:\s*"([^"\\]{1,200})"')
# each with a literal prefix, which the regex engine looks for at C speed (an alternation at the top had it
# try a match at every byte: 100K instructions for a stream's last three reads)
_REASON = re.compile(rb'_reason"\s*:\s*"([^"\\]{1,64})"')  # after "finish or "stop
_RESPONSE_END = re.compile(rb'"type"\s*:\s*"response\.(completed|incomplete|failed)"')
MAX_REASONS = 16
# the module's own Random (reseeded in each forked worker, unlike a Random of chatgate's), its method bound
_getrandbits = random.getrandbits
_time_ns = time.time_ns
_perf_counter = time.perf_counter
_TRACEPARENT = (b"00-%032x-%016x-00", b"00-%032x-%016x-01")  # by sampled


class Tracing:
    """The process's tracing: its sampler, the W3C trace-context propagator, and the export queue in front
    of the exporter, which holds an `ExchangeTrace` per request (chatgate.tracing.queue)."""

    def __init__(self, queue: ExportQueue[ExchangeTrace], counts: TraceCounts, capture_content: bool,
                 parent_based: bool, ratio: float) -> None:
        from opentelemetry.trace import get_current_span
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.queue = queue
        self._put = queue.put
        self.counts = counts
        self.capture_content = capture_content
        self.parent_based = parent_based
        self.bound = 0 if ratio <= 0 else (1 << 64) if ratio >= 1 else round(ratio * (1 << 64))
        self.propagator = TraceContextTextMapPropagator()
        self._get_span = get_current_span
        # the name and shared attributes of a SERVER span, by method, route, client, ...; of an attempt's
        # CLIENT span, by route, model, stream and max_tokens
        self.servers: BoundedDict[tuple[Any, ...], Fixed] = BoundedDict(FIXED_MAX)
        self.attempts: BoundedDict[tuple[Any, ...], Fixed] = BoundedDict(FIXED_MAX)

    def sampled(self, trace_id: int, parent_sampled: bool | None) -> bool:
        """ParentBased(TraceIdRatioBased) as the SDK decides it, or the ratio alone."""
        if parent_sampled is not None and self.parent_based:
            return parent_sampled
        return (trace_id & MASK64) < self.bound

    def start(self, method: str, route: str, label: str, scope: Mapping[str, Any], request_id: str
              ) -> ExchangeTrace:
        """The request's SERVER span, named by its route, continuing the client's traceparent (and
        tracestate) if it sent one; `label` is the route as in usage records (it names the operation)."""
        headers = dict(scope["headers"])  # one pass, in C (ASGI names are lowercase; the last one wins)
        traceparent = headers.get(b"traceparent")
        tracestate = headers.get(b"tracestate")
        if traceparent is None and tracestate is None:
            trace_id = _getrandbits(128) or 1
            trace = ExchangeTrace(self, trace_id, 0, False, "", label, (trace_id & MASK64) < self.bound,
                                  request_id)
        else:
            trace = self._continued(traceparent, tracestate, label, request_id)
        if trace.sampled:
            client = scope.get("client")
            agent = headers.get(b"user-agent")
            key = (method, route, scope.get("path", route), scope.get("scheme", "http"),
                   scope.get("http_version", "1.1"), scope.get("server"), client[0] if client else None,
                   agent.decode("latin-1") if agent else None)
            trace.server = self.servers.get(key) or self.servers.get_or_make(key, _server_fixed)
        return trace

    def _continued(self, traceparent: bytes | None, tracestate: bytes | None, label: str, request_id: str
                   ) -> ExchangeTrace:
        """The trace of a request that sent a trace context (valid or not: it is not sent on as it is)."""
        trace_id, parent_id, remote, state, parent_sampled = 0, 0, False, "", None
        if traceparent:
            carrier = {"traceparent": traceparent.decode("latin-1")}
            if tracestate:
                carrier["tracestate"] = tracestate.decode("latin-1")
            ctx = self._get_span(self.propagator.extract(carrier)).get_span_context()
            if ctx.is_valid:
                trace_id, parent_id, remote = ctx.trace_id, ctx.span_id, True
                state, parent_sampled = ctx.trace_state.to_header(), ctx.trace_flags.sampled
        if not trace_id:
            trace_id = _getrandbits(128) or 1
        trace = ExchangeTrace(self, trace_id, parent_id, remote, state, label,
                              self.sampled(trace_id, parent_sampled), request_id)
        trace.strip = True
        return trace

    def emit(self, trace: ExchangeTrace) -> None:
        self._put(trace)

    def force_flush(self, timeout_ms: int = 30000) -> bool:
        return self.queue.force_flush(timeout_ms)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Export what is queued, for at most `timeout_s` (an exporter that is down does not hold a stop)."""
        self.queue.shutdown(int(timeout_s * 1000))

    def collector(self) -> Any:
        return TraceCollector(self.counts)


def _server_fixed(key: tuple[Any, ...]) -> Fixed:
    method, route, path, scheme, version, server, client, agent = key
    attributes: dict[str, Any] = {"http.request.method": method, "http.route": route, "url.path": path,
                                  "url.scheme": scheme, "network.protocol.version": version}
    if server:
        attributes["server.address"], attributes["server.port"] = server[0], server[1]
    if client:
        attributes["client.address"] = client
    if agent:
        attributes["user_agent.original"] = agent
    return Fixed(f"{method} {route}", attributes)


def _attempt_fixed(key: tuple[Any, ...]) -> Fixed:
    route, model, stream, max_tokens = key
    operation = operation_of(route)
    attributes: dict[str, Any] = {"gen_ai.operation.name": operation, "gen_ai.provider.name": PROVIDER,
                                  "gen_ai.request.model": model, "gen_ai.request.stream": stream}
    if max_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = max_tokens
    return Fixed(f"{operation} {model}", attributes)


def operation_of(route: str) -> str:
    return "text_completion" if route.endswith("/completions") and not route.endswith("chat/completions") \
        else "chat"


class ExchangeTrace:
    """One request's trace, as the request path records it; its spans are made when it is exported
    (chatgate.tracing.lean.spans_of)."""

    __slots__ = ("attempt", "attempt_end", "attempt_t0", "content", "conversation", "early_code", "end",
                 "failed", "first_chunk", "max_tokens", "parent_id", "reasons", "record", "remote_parent",
                 "request_id", "resp_id", "resp_model", "route", "rules", "sampled", "scan_each", "server",
                 "span_id", "start", "status_code", "strip", "tail0", "tail1", "tail2", "trace_id",
                 "trace_state", "tracing")
    # set before they are read (not in __init__, which every request pays for): the time of a streamed
    # attempt's start, whether each of its reads is scanned for its finish reasons or its last three at the
    # end; when it ends, the usage record and status (no record: refused before the body was read), the
    # last attempt's end and content (tracing.capture_content)
    attempt_t0: float
    scan_each: bool
    tail0: bytes
    tail1: bytes
    tail2: bytes
    record: UsageRecord | None
    status_code: int
    early_code: str | None
    content: tuple[str | None, str | None] | None
    attempt_end: int
    end: int

    def __init__(self, tracing: Tracing, trace_id: int, parent_id: int, remote: bool, state: str, route: str,
                 sampled: bool, request_id: str) -> None:
        self.tracing = tracing
        self.trace_id = trace_id
        self.span_id = _getrandbits(64) or 1
        self.start = _time_ns()
        self.parent_id = parent_id
        self.remote_parent = remote
        self.trace_state = state
        self.route = route
        self.sampled = sampled
        self.request_id = request_id
        self.strip = False  # the client sent a trace context (valid or not): it is not sent on
        self.server: Fixed | None = None  # the SERVER span's name and route attributes (sampled)
        self.max_tokens: int | None = None
        self.rules: tuple[str, ...] | None = None
        self.attempt: tuple[int, int, Fixed] | None = None  # the open (then the last) attempt: id, start
        self.failed: list[Failed] | None = None
        self.first_chunk: float | None = None
        self.resp_id: str | None = None
        self.resp_model: str | None = None
        self.reasons: list[str] | None = None
        self.conversation: str | None = None  # the agent run it is part of (chatgate/runs/)

    @property
    def attempt_open(self) -> bool:
        return self.attempt is not None

    # --- the upstream attempts ---------------------------------------------------------

    def start_attempt(self, headers: list[tuple[bytes, bytes]], model: str, stream: bool
                      ) -> list[tuple[bytes, bytes]]:
        """A CLIENT span for one upstream attempt (one before it still open is ended as failed); the
        headers to send it with: the client's trace context replaced by this span's."""
        if self.attempt is not None:
            self.attempt_failed("_OTHER")
        span_id = _getrandbits(64) or 1
        if self.sampled:
            key = (self.route, model, stream, self.max_tokens)
            attempts = self.tracing.attempts
            shared = attempts.get(key) or attempts.get_or_make(key, _attempt_fixed)
            self.attempt = (span_id, _time_ns(), shared)
            if stream:  # the time to the first chunk
                self.attempt_t0 = _perf_counter()
                self.scan_each = self.route.endswith("/responses")
                self.tail0 = self.tail1 = self.tail2 = b""
        out = [(k, v) for k, v in headers if k.lower() not in TRACE_HEADERS] if self.strip else headers.copy()
        out.append((b"traceparent", _TRACEPARENT[self.sampled] % (self.trace_id, span_id)))
        if self.trace_state:
            out.append((b"tracestate", self.trace_state.encode("latin-1", "replace")))
        return out

    def attempt_failed(self, error_type: str, status: int | None = None) -> None:
        """End the open attempt as failed (the retry engine tries again, or gives up)."""
        attempt, self.attempt = self.attempt, None
        if attempt is None:
            return
        ended = (attempt[0], attempt[1], _time_ns(), attempt[2], status, error_type)
        if self.failed is None:
            self.failed = [ended]
        else:
            self.failed.append(ended)
        self.first_chunk = self.resp_id = self.resp_model = self.reasons = None  # the next attempt's own

    def feed(self, chunk: bytes) -> None:
        """A relayed stream's bytes: its first chunk's time, the answer's id, model and finish reasons."""
        if not self.sampled:
            return
        if self.first_chunk is None and b"data:" in chunk:
            self.first_chunk = _perf_counter() - self.attempt_t0
        if self.resp_id is None and (m := _ID.search(chunk)):
            self.resp_id = m.group(1).decode("utf-8", "replace")
        if self.resp_model is None and (m := _MODEL.search(chunk)):
            self.resp_model = m.group(1).decode("utf-8", "replace")
        if self.scan_each:  # the Responses API: its last event (its type first) may be long, in many reads
            if b"response." in chunk and (b"response.completed" in chunk or b"response.incomplete" in chunk
                                          or b"response.failed" in chunk):
                self._reasons_in(chunk)
        else:  # the others end with their finish reasons: the last reads are scanned once, at the end
            self.tail2, self.tail1, self.tail0 = self.tail1, self.tail0, chunk

    def _reasons_in(self, data: bytes) -> None:
        """The finish reasons in `data`: chat and FIM's finish_reason, Anthropic's stop_reason, the
        Responses API's final event's type."""
        reasons = self.reasons
        if reasons is None:
            reasons = self.reasons = []
        for found in _REASON.finditer(data):
            at = found.start()
            if len(reasons) < MAX_REASONS and (data.endswith(b'"finish', 0, at)
                                               or data.endswith(b'"stop', 0, at)):
                reasons.append(found.group(1).decode("utf-8", "replace"))
        if b"response." in data:
            for found in _RESPONSE_END.finditer(data):
                if len(reasons) < MAX_REASONS:
                    reasons.append(found.group(1).decode("utf-8", "replace"))

    def answer(self, answer: Any) -> None:
        """A buffered answer's id, model and finish reasons (chat and FIM choices, Anthropic's stop_reason,
        the Responses API's status)."""
        if not self.sampled or not isinstance(answer, dict):
            return
        get = answer.get
        if type(found := get("id")) is str:
            self.resp_id = found
        if type(found := get("model")) is str:
            self.resp_model = found
        reasons = []
        if type(choices := get("choices")) is list:
            for c in choices:
                if type(c) is dict and type(reason := c.get("finish_reason")) is str:
                    reasons.append(reason)
        if "stop_reason" in answer and type(reason := answer["stop_reason"]) is str:
            reasons.append(reason)
        if "output" in answer and type(reason := get("status")) is str:
            reasons.append(reason)
        self.reasons = reasons if len(reasons) <= MAX_REASONS else reasons[:MAX_REASONS]

    # --- the end of the request --------------------------------------------------------

    def finish(self, record: UsageRecord, status: int, data: Mapping[str, Any] | None = None,
               completion: str | None = None) -> None:
        """End the open attempt (its answer's usage) and the SERVER span. `data` and `completion` (the
        request and the answer) only when tracing.capture_content is on."""
        if not self.sampled:
            return
        self.record = record
        self.status_code = status
        if self.attempt is not None:
            self.attempt_end = _time_ns()
            if self.attempt[2].attributes["gen_ai.request.stream"] and not self.scan_each and self.tail0:
                self._reasons_in(self.tail2 + self.tail1 + self.tail0)  # a reason cut between two reads too
            self.content = None if data is None and completion is None else (
                None if data is None else orjson.dumps(input_messages(data)).decode(),
                None if completion is None else self._output(completion))
        self.end = _time_ns()
        self.tracing.emit(self)

    def _output(self, completion: str) -> str:
        out = [{"role": "assistant", "parts": [{"type": "text", "content": completion}],
                "finish_reason": self.reasons[0] if self.reasons else None}]
        return orjson.dumps(out).decode()

    def refused(self, problems: Iterable[Any]) -> None:
        """The rule codes of a refusal (R16, A3, ... or the problem's code where it has no rule number)."""
        self.rules = tuple(dict.fromkeys(p.rule or p.code for p in problems))

    def early(self, status: int, code: str | None) -> None:
        """A request refused before it was read (auth, body size): the SERVER span alone."""
        if not self.sampled:
            return
        self.record = None
        self.status_code = status
        self.early_code = code
        self.end = _time_ns()
        self.tracing.emit(self)


def input_messages(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The request's messages (or FIM prompt, or Responses input) in the convention's role/parts shape."""
    out: list[dict[str, Any]] = []
    system = data.get("system") if "system" in data else data.get("instructions")
    if system is not None:
        out.append({"role": "system", "parts": _parts(system)})
    messages = data.get("messages")
    if messages is None:
        messages = data.get("input")
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    for m in messages if isinstance(messages, list) else ():
        if isinstance(m, dict):
            out.append({"role": m.get("role", m.get("type", "user")), "parts": _parts(m.get("content"))})
    if "prompt" in data and not out:
        out.append({"role": "user", "parts": _parts(data.get("prompt"))})
    return out


def _part(p: Any) -> dict[str, Any]:
    if isinstance(p, dict) and isinstance(p.get("text"), str):
        return {"type": "text", "content": p["text"]}
    return {"type": "generic", "content": p}


def _parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    if isinstance(content, list):
        return [_part(p) for p in content]
    return [] if content is None else [{"type": "generic", "content": content}]
