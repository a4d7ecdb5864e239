"""The spans of one request: its SERVER span and a CLIENT span per upstream attempt, with the
OpenTelemetry semantic conventions v1.44.0 for HTTP and for GenAI (`gen_ai.*`, as in
opentelemetry-semantic-conventions 0.66b2: `gen_ai.provider.name`, `gen_ai.usage.cache_read.input_tokens`,
`gen_ai.usage.reasoning.output_tokens`, `gen_ai.response.time_to_first_chunk`; docs/observability.md).

The gateway holds an `ExchangeTrace` per request (None when tracing is off, so every hook is one `is not
None` test). The retry engine calls `start_attempt` before each upstream attempt and `attempt_failed` for one
it gives up on; the last attempt ends with the request (`finish`), when its usage is known.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from app.store.base import UsageRecord
from app.tracing.counts import TraceCollector

PROVIDER = "deepseek"
TRACE_HEADERS = (b"traceparent", b"tracestate")
_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,200})"')
_MODEL = re.compile(rb'"model"\s*:\s*"([^"\\]{1,200})"')
_FINISH = re.compile(rb'"(?:finish_reason|stop_reason)"\s*:\s*"([^"\\]{1,64})"'
                     rb'|"type"\s*:\s*"response\.(completed|incomplete|failed)"')
MAX_REASONS = 16


class Tracing:
    """The process's tracer (the SDK's), the W3C trace-context propagator and the export counts."""

    def __init__(self, provider: Any, tracer: Any, counts: Any, capture_content: bool) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer = tracer
        self.counts = counts
        self.capture_content = capture_content
        self.propagator = TraceContextTextMapPropagator()
        self._trace = trace
        self.SERVER, self.CLIENT = trace.SpanKind.SERVER, trace.SpanKind.CLIENT
        self.ERROR = trace.Status(trace.StatusCode.ERROR)

    def start(self, headers: Mapping[str, str], method: str, route: str, label: str, scope: Mapping[str, Any],
              request_id: str) -> ExchangeTrace:
        """The request's SERVER span, named by its route, continuing the client's traceparent (and
        tracestate) if it sent one; `label` is the route as in usage records (it names the operation)."""
        carrier = {name: value for name in ("traceparent", "tracestate") if (value := headers.get(name))}
        parent = self.propagator.extract(carrier) if carrier else None
        attributes: dict[str, Any] = {
            "http.request.method": method, "http.route": route, "url.path": scope.get("path", route),
            "url.scheme": scope.get("scheme", "http"),
            "network.protocol.version": scope.get("http_version", "1.1"), "chatgate.request_id": request_id}
        server, client = scope.get("server"), scope.get("client")
        if server:
            attributes["server.address"], attributes["server.port"] = server[0], server[1]
        if client:
            attributes["client.address"] = client[0]
        if agent := headers.get("user-agent"):
            attributes["user_agent.original"] = agent
        span = self.tracer.start_span(f"{method} {route}", parent, self.SERVER, attributes)
        return ExchangeTrace(self, span, label)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Export what is queued, for at most `timeout_s` (an exporter that is down does not hold a stop)."""
        self.provider.force_flush(int(timeout_s * 1000))
        self.provider.shutdown()

    def collector(self) -> Any:
        return TraceCollector(self.counts)


def operation_of(route: str) -> str:
    return "text_completion" if route.endswith("/completions") and not route.endswith("chat/completions") \
        else "chat"


class ExchangeTrace:
    __slots__ = (
        "_attempt_t0",
        "_first_chunk",
        "_reasons",
        "_resp_id",
        "_resp_model",
        "attempt",
        "max_tokens",
        "route",
        "rules",
        "server",
        "tracing",
    )

    def __init__(self, tracing: Tracing, server: Any, route: str) -> None:
        self.tracing = tracing
        self.server = server
        self.route = route
        self.attempt: Any = None  # the open CLIENT span
        self.max_tokens: int | None = None
        self.rules: list[str] | None = None
        self._attempt_t0 = 0.0
        self._first_chunk: float | None = None
        self._resp_id: str | None = None
        self._resp_model: str | None = None
        self._reasons: list[str] = []

    # --- the upstream attempts ---------------------------------------------------------

    def start_attempt(self, headers: list[tuple[bytes, bytes]], model: str, stream: bool
                      ) -> list[tuple[bytes, bytes]]:
        """A CLIENT span for one upstream attempt (one before it still open is ended as failed); the
        headers to send it with: the client's trace context replaced by this span's."""
        if self.attempt is not None:
            self.attempt_failed("_OTHER")
        t = self.tracing
        operation = operation_of(self.route)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": operation, "gen_ai.provider.name": PROVIDER,
            "gen_ai.request.model": model, "gen_ai.request.stream": stream}
        if self.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = self.max_tokens
        parent = t._trace.set_span_in_context(self.server)
        span = self.attempt = t.tracer.start_span(f"{operation} {model}", parent, t.CLIENT, attributes)
        self._attempt_t0 = time.perf_counter()
        self._first_chunk, self._resp_id, self._resp_model, self._reasons = None, None, None, []
        ctx = span.get_span_context()
        if not ctx.is_valid:
            return headers
        out = [(k, v) for k, v in headers if k.lower() not in TRACE_HEADERS]
        parent_header = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
        out.append((b"traceparent", parent_header.encode()))
        if ctx.trace_state:
            out.append((b"tracestate", ctx.trace_state.to_header().encode("latin-1", "replace")))
        return out

    def attempt_failed(self, error_type: str, status: int | None = None) -> None:
        """End the open attempt as failed (the retry engine tries again, or gives up)."""
        span, self.attempt = self.attempt, None
        if span is None:
            return
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        span.set_attribute("error.type", error_type)
        span.set_status(self.tracing.ERROR)
        span.end()

    def feed(self, chunk: bytes) -> None:
        """A relayed stream's bytes: its first chunk's time, the answer's id, model and finish reasons."""
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
        if not isinstance(answer, dict):
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
        error = None if status < 400 else str(status)
        outcome = record.outcome
        span = self.attempt
        if span is not None:
            self.attempt = None
            if span.is_recording():
                self._end_attempt(span, record, status, outcome, data, completion)
            span.end()
        server = self.server
        if server.is_recording():
            attrs: dict[str, Any] = {
                "http.response.status_code": status, "chatgate.outcome": outcome,
                "chatgate.team": record.team, "chatgate.key_id": record.key_id,
                "chatgate.cost_usd": record.cost_picousd / 1e12, "gen_ai.request.model": record.model}
            if record.repairs:
                attrs["chatgate.repairs"] = record.repairs.split(",")
            if self.rules:
                attrs["chatgate.rules"] = self.rules
            elif record.rule_code:
                attrs["chatgate.rules"] = [record.rule_code]
            if error is not None:
                attrs["error.type"] = error
            server.set_attributes(attrs)
            if status >= 500:
                server.set_status(self.tracing.ERROR)
        server.end()

    def _end_attempt(self, span: Any, record: UsageRecord, status: int, outcome: str,
                     data: Mapping[str, Any] | None, completion: str | None) -> None:
        attrs: dict[str, Any] = {}
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
            attrs["gen_ai.usage.input_tokens"] = record.prompt_tokens
            attrs["gen_ai.usage.output_tokens"] = record.completion_tokens
            attrs["gen_ai.usage.cache_read.input_tokens"] = record.prompt_cache_hit_tokens
            attrs["gen_ai.usage.reasoning.output_tokens"] = record.reasoning_tokens
            attrs["chatgate.tokens_exact"] = record.tokens_exact
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
        span.set_attributes(attrs)
        if error is not None and outcome != "client_disconnected":
            span.set_status(self.tracing.ERROR)

    def refused(self, problems: Iterable[Any]) -> None:
        """The rule codes of a refusal (R16, A3, ... or the problem's code where it has no rule number)."""
        self.rules = list(dict.fromkeys(p.rule or p.code for p in problems))

    def early(self, status: int, code: str | None) -> None:
        """A request refused before it was read (auth, body size): the SERVER span alone."""
        server = self.server
        server.set_attributes({"http.response.status_code": status, "error.type": str(status),
                               "chatgate.outcome": "refused"})
        if code:
            server.set_attribute("chatgate.rules", [code])
        if status >= 500:
            server.set_status(self.tracing.ERROR)
        server.end()


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
