"""The spans of one request: its SERVER span and a CLIENT span per upstream attempt, with the
OpenTelemetry semantic conventions v1.44.0 for HTTP and for GenAI (`gen_ai.*`, as in
opentelemetry-semantic-conventions 0.66b2: `gen_ai.provider.name`, `gen_ai.usage.cache_read.input_tokens`,
`gen_ai.usage.reasoning.output_tokens`, `gen_ai.response.time_to_first_chunk`; docs/observability.md).

The gateway holds an `ExchangeTrace` per request (None when tracing is off, so every hook is one `is not
None` test). A sampled request's spans are `LeanSpan` records handed to the SDK's batch span processor
(app.tracing.lean says why not the SDK's own spans); an unsampled one still sends its trace context on.
The retry engine calls `start_attempt` before each upstream attempt and `attempt_failed` for one it gives
up on; the last attempt ends with the request (`finish`), when its usage is known.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from app.store.base import UsageRecord
from app.tracing.counts import TraceCollector, TraceCounts
from app.tracing.lean import CLIENT, SERVER, STATUS_ERROR, STATUS_UNSET, Fixed, LeanSpan, fixed

PROVIDER = "deepseek"
TRACE_HEADERS = (b"traceparent", b"tracestate")
_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,200})"')
_MODEL = re.compile(rb'"model"\s*:\s*"([^"\\]{1,200})"')
_FINISH = re.compile(rb'"(?:finish_reason|stop_reason)"\s*:\s*"([^"\\]{1,64})"'
                     rb'|"type"\s*:\s*"response\.(completed|incomplete|failed)"')
MAX_REASONS = 16


class Tracing:
    """The process's tracing: its sampler, the W3C trace-context propagator, and the SDK's batch span
    processor in front of the exporter. Spans are `LeanSpan` records (app.tracing.lean)."""

    def __init__(self, processor: Any, counts: TraceCounts, capture_content: bool, parent_based: bool,
                 ratio: float) -> None:
        from opentelemetry.trace import get_current_span
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.processor = processor
        self.counts = counts
        self.capture_content = capture_content
        self.parent_based = parent_based
        self.bound = 0 if ratio <= 0 else (1 << 64) if ratio >= 1 else round(ratio * (1 << 64))
        self.propagator = TraceContextTextMapPropagator()
        # the SDK's queue (BatchSpanProcessor.on_end checks what a LeanSpan always is: sampled)
        inner = getattr(processor, "_batch_processor", None)
        self._queue = getattr(inner, "emit", None) or processor.on_end
        self._get_span = get_current_span

    def sampled(self, trace_id: int, parent_sampled: bool | None) -> bool:
        """ParentBased(TraceIdRatioBased) as the SDK decides it, or the ratio alone."""
        if parent_sampled is not None and self.parent_based:
            return parent_sampled
        return (trace_id & 0xFFFFFFFFFFFFFFFF) < self.bound

    def start(self, method: str, route: str, label: str, scope: Mapping[str, Any], request_id: str
              ) -> ExchangeTrace:
        """The request's SERVER span, named by its route, continuing the client's traceparent (and
        tracestate) if it sent one; `label` is the route as in usage records (it names the operation)."""
        traceparent = tracestate = agent = None
        for name, value in scope["headers"]:  # one pass over the ASGI headers (their names are lowercase)
            if name == b"traceparent":
                traceparent = value.decode("latin-1")
            elif name == b"tracestate":
                tracestate = value.decode("latin-1")
            elif name == b"user-agent":
                agent = value.decode("latin-1")
        trace_id, parent_id, remote, state, parent_sampled = 0, 0, False, "", None
        if traceparent:
            carrier = {"traceparent": traceparent}
            if tracestate:
                carrier["tracestate"] = tracestate
            ctx = self._get_span(self.propagator.extract(carrier)).get_span_context()
            if ctx.is_valid:
                trace_id, parent_id, remote = ctx.trace_id, ctx.span_id, True
                state, parent_sampled = ctx.trace_state.to_header(), ctx.trace_flags.sampled
        if not trace_id:
            trace_id = random.getrandbits(128) or 1
        trace = ExchangeTrace(self, trace_id, parent_id, remote, state, label,
                              self.sampled(trace_id, parent_sampled))
        trace.strip = traceparent is not None or tracestate is not None
        if trace.sampled:
            client = scope.get("client")
            key = (method, route, scope.get("path", route), scope.get("scheme", "http"),
                   scope.get("http_version", "1.1"), scope.get("server"), client[0] if client else None,
                   agent)
            trace.fixed = fixed(key, lambda: _server_attributes(*key))
            trace.name = f"{method} {route}"
            trace.attributes = {"chatgate.request_id": request_id}
        return trace

    def emit(self, span: LeanSpan | ExchangeTrace) -> None:
        self.counts.before_queue()
        self._queue(span)

    def force_flush(self, timeout_ms: int = 30000) -> bool:
        return bool(self.processor.force_flush(timeout_ms))

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Export what is queued, for at most `timeout_s` (an exporter that is down does not hold a stop)."""
        self.processor.force_flush(int(timeout_s * 1000))
        self.processor.shutdown()

    def collector(self) -> Any:
        return TraceCollector(self.counts)


def _server_attributes(method: str, route: str, path: str, scheme: str, version: str, server: Any,
                       client: str | None, agent: str | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {"http.request.method": method, "http.route": route, "url.path": path,
                                  "url.scheme": scheme, "network.protocol.version": version}
    if server:
        attributes["server.address"], attributes["server.port"] = server[0], server[1]
    if client:
        attributes["client.address"] = client
    if agent:
        attributes["user_agent.original"] = agent
    return attributes


def _attempt_attributes(operation: str, model: str, stream: bool, max_tokens: int | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {"gen_ai.operation.name": operation, "gen_ai.provider.name": PROVIDER,
                                  "gen_ai.request.model": model, "gen_ai.request.stream": stream}
    if max_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = max_tokens
    return attributes


def operation_of(route: str) -> str:
    return "text_completion" if route.endswith("/completions") and not route.endswith("chat/completions") \
        else "chat"


class ExchangeTrace:
    """One request's trace; also its SERVER span's record, as `LeanSpan` is (the fields it has of the same
    names), queued as it is when the request ends: one object less per request."""

    __slots__ = ("_attempt", "_attempt_t0", "_first_chunk", "_reasons", "_resp_id", "_resp_model",
                 "attributes", "end", "fixed", "max_tokens", "name", "parent_id", "remote_parent", "route",
                 "rules", "sampled", "span_id", "start", "status", "strip", "trace_id", "trace_state",
                 "tracing")
    kind = SERVER
    context = LeanSpan.context

    def __init__(self, tracing: Tracing, trace_id: int, parent_id: int, remote: bool, state: str, route: str,
                 sampled: bool) -> None:
        self.tracing = tracing
        self.trace_id = trace_id
        self.span_id = random.getrandbits(64) or 1
        self.parent_id = parent_id
        self.remote_parent = remote
        self.trace_state = state
        self.route = route
        self.sampled = sampled
        self.start = time.time_ns()
        self.name = ""
        self.end = 0
        self.status = STATUS_UNSET
        self.fixed: Fixed | None = None
        self.strip = False  # the client sent a trace context (valid or not): it is not sent on
        self.attributes: dict[str, Any] = {}
        self._attempt: tuple[int, int, dict[str, Any], Fixed] | None = None  # the open CLIENT span
        self.max_tokens: int | None = None
        self.rules: list[str] | None = None
        self._attempt_t0 = 0.0
        self._first_chunk: float | None = None
        self._resp_id: str | None = None
        self._resp_model: str | None = None
        self._reasons: list[str] = []

    @property
    def attempt_open(self) -> bool:
        return self._attempt is not None

    # --- the upstream attempts ---------------------------------------------------------

    def start_attempt(self, headers: list[tuple[bytes, bytes]], model: str, stream: bool
                      ) -> list[tuple[bytes, bytes]]:
        """A CLIENT span for one upstream attempt (one before it still open is ended as failed); the
        headers to send it with: the client's trace context replaced by this span's."""
        if self._attempt is not None:
            self.attempt_failed("_OTHER")
        span_id = random.getrandbits(64) or 1
        if self.sampled:
            key = (operation_of(self.route), model, stream, self.max_tokens)
            self._attempt = (span_id, time.time_ns(), {}, fixed(key, lambda: _attempt_attributes(*key)))
        if stream:  # the time to the first chunk
            self._attempt_t0 = time.perf_counter()
        self._first_chunk, self._resp_id, self._resp_model, self._reasons = None, None, None, []
        out = [(k, v) for k, v in headers if k.lower() not in TRACE_HEADERS] if self.strip else [*headers]
        flags = "01" if self.sampled else "00"
        out.append((b"traceparent", f"00-{self.trace_id:032x}-{span_id:016x}-{flags}".encode()))
        if self.trace_state:
            out.append((b"tracestate", self.trace_state.encode("latin-1", "replace")))
        return out

    def attempt_failed(self, error_type: str, status: int | None = None) -> None:
        """End the open attempt as failed (the retry engine tries again, or gives up)."""
        attempt, self._attempt = self._attempt, None
        if attempt is None:
            return
        if status is not None:
            attempt[2]["http.response.status_code"] = status
        attempt[2]["error.type"] = error_type
        self._emit_attempt(attempt, STATUS_ERROR)

    def _emit_attempt(self, attempt: tuple[int, int, dict[str, Any], Fixed], status: int) -> None:
        span_id, start, attributes, shared = attempt
        name = f"{shared.attributes['gen_ai.operation.name']} {shared.attributes['gen_ai.request.model']}"
        self.tracing.emit(LeanSpan(name, CLIENT, self.trace_id, span_id, self.span_id, False,
                                   self.trace_state, start, time.time_ns(), attributes, status, shared))

    def feed(self, chunk: bytes) -> None:
        """A relayed stream's bytes: its first chunk's time, the answer's id, model and finish reasons."""
        if not self.sampled:
            return
        if self._first_chunk is None and b"data:" in chunk:
            self._first_chunk = time.perf_counter() - self._attempt_t0
        if self._resp_id is None and (m := _ID.search(chunk)):
            self._resp_id = m.group(1).decode("utf-8", "replace")
        if self._resp_model is None and (m := _MODEL.search(chunk)):
            self._resp_model = m.group(1).decode("utf-8", "replace")
        if len(self._reasons) < MAX_REASONS and (b"_reason" in chunk or b"response." in chunk):
            for found in _FINISH.finditer(chunk):
                reason = (found.group(1) or found.group(2)).decode("utf-8", "replace")
                self._reasons.append(reason)

    def answer(self, answer: Any) -> None:
        """A buffered answer's id, model and finish reasons (chat and FIM choices, Anthropic's stop_reason,
        the Responses API's status)."""
        if not isinstance(answer, dict) or not self.sampled:
            return
        if isinstance(answer.get("id"), str):
            self._resp_id = answer["id"]
        if isinstance(answer.get("model"), str):
            self._resp_model = answer["model"]
        reasons = [c.get("finish_reason") for c in answer.get("choices") or () if isinstance(c, dict)]
        reasons += [answer.get("stop_reason"), answer.get("status") if "output" in answer else None]
        self._reasons = [r for r in reasons if isinstance(r, str)][:MAX_REASONS]

    # --- the end of the request --------------------------------------------------------

    def finish(self, record: UsageRecord, status: int, data: Mapping[str, Any] | None = None,
               completion: str | None = None) -> None:
        """End the open attempt (its answer's usage) and the SERVER span. `data` and `completion` (the
        request and the answer) only when tracing.capture_content is on."""
        if not self.sampled:
            return
        outcome = record.outcome
        attempt, self._attempt = self._attempt, None
        if attempt is not None:
            failed = self._end_attempt(attempt[2], record, status, outcome, data, completion)
            self._emit_attempt(attempt, STATUS_ERROR if failed else STATUS_UNSET)
        attrs = self.attributes
        attrs.update({"http.response.status_code": status, "chatgate.outcome": outcome,
                      "chatgate.team": record.team, "chatgate.key_id": record.key_id,
                      "chatgate.cost_usd": record.cost_picousd / 1e12, "gen_ai.request.model": record.model})
        if record.repairs:
            attrs["chatgate.repairs"] = record.repairs.split(",")
        if self.rules:
            attrs["chatgate.rules"] = self.rules
        elif record.rule_code:
            attrs["chatgate.rules"] = [record.rule_code]
        if status >= 400:
            attrs["error.type"] = str(status)
        self._emit_server(STATUS_ERROR if status >= 500 else STATUS_UNSET)

    def _emit_server(self, status: int) -> None:
        self.end = time.time_ns()
        self.status = status
        self.tracing.emit(self)

    def _end_attempt(self, attrs: dict[str, Any], record: UsageRecord, status: int, outcome: str,
                     data: Mapping[str, Any] | None, completion: str | None) -> bool:
        """Fill in the attempt's answer; whether it failed."""
        if record.upstream_status is not None:
            attrs["http.response.status_code"] = record.upstream_status
        if self._resp_id is not None:
            attrs["gen_ai.response.id"] = self._resp_id
        if self._resp_model is not None or outcome == "ok":
            attrs["gen_ai.response.model"] = self._resp_model or record.model
        if self._reasons:
            attrs["gen_ai.response.finish_reasons"] = self._reasons
        if self._first_chunk is not None:
            attrs["gen_ai.response.time_to_first_chunk"] = self._first_chunk
        if outcome in ("ok", "client_disconnected") or record.prompt_tokens or record.completion_tokens:
            attrs.update({"gen_ai.usage.input_tokens": record.prompt_tokens,
                          "gen_ai.usage.output_tokens": record.completion_tokens,
                          "gen_ai.usage.cache_read.input_tokens": record.prompt_cache_hit_tokens,
                          "gen_ai.usage.reasoning.output_tokens": record.reasoning_tokens})
            if not record.tokens_exact:
                attrs["chatgate.tokens_exact"] = False
        attrs["chatgate.outcome"] = outcome
        error = _attempt_error(outcome, status, record.upstream_status)
        if error is not None:
            attrs["error.type"] = error
        if data is not None:
            attrs["gen_ai.input.messages"] = orjson.dumps(input_messages(data)).decode()
        if completion is not None:
            out = [{"role": "assistant", "parts": [{"type": "text", "content": completion}],
                    "finish_reason": self._reasons[0] if self._reasons else None}]
            attrs["gen_ai.output.messages"] = orjson.dumps(out).decode()
        return error is not None and outcome != "client_disconnected"

    def refused(self, problems: Iterable[Any]) -> None:
        """The rule codes of a refusal (R16, A3, ... or the problem's code where it has no rule number)."""
        self.rules = list(dict.fromkeys(p.rule or p.code for p in problems))

    def early(self, status: int, code: str | None) -> None:
        """A request refused before it was read (auth, body size): the SERVER span alone."""
        if not self.sampled:
            return
        attrs = self.attributes
        attrs["http.response.status_code"] = status
        attrs["error.type"] = str(status)
        attrs["chatgate.outcome"] = "refused"
        if code:
            attrs["chatgate.rules"] = [code]
        self._emit_server(STATUS_ERROR if status >= 500 else STATUS_UNSET)


def _attempt_error(outcome: str, status: int, upstream_status: int | None) -> str | None:
    if upstream_status is not None and upstream_status >= 400:
        return str(upstream_status)
    if outcome == "ok":
        return None
    if outcome == "upstream_failed":
        return "timeout" if status == 504 else "upstream_failed"
    return outcome


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
