"""A finished request's spans, and their OTLP protobuf encoding, done by the export thread.

The request path records one `ExchangeTrace` per request (chatgate.tracing.spans): ids, times, references to
what it already has (its usage record, the answer's id, model and finish reasons) and no attribute of its
own. The export queue (chatgate.tracing.queue) holds it as it is, and its thread turns it into spans here:
`spans_of` says what each span is, once; an `Encoder` writes those spans into an OTLP
ExportTraceServiceRequest (OTLP/HTTP), with every attribute entry that repeats from request to request
(the route, the model, the team, a status, a finish reason) encoded once and kept, and `readable` makes
them the SDK's `ReadableSpan`s for any other exporter (gRPC).

Why not the SDK's own spans: its `Span` validates every attribute as it is set (~38 µs a span of twenty
attributes) and its OTLP encoder builds a protobuf object per attribute (~90 µs a span), together more
than half of what chatgate spends on a request.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from chatgate.bounded import BoundedDict
from chatgate.store.base import UsageRecord

SERVER, CLIENT = 2, 3  # OTLP's Span.SpanKind
STATUS_UNSET, STATUS_ERROR = 0, 2
FLAG_SAMPLED = 0x01
FLAG_HAS_REMOTE, FLAG_REMOTE = 0x100, 0x200  # Span.flags: whether the parent is known to be remote
MASK64 = 0xFFFFFFFFFFFFFFFF


class Fixed:
    """A span's name and the attributes many spans have alike (a route's method, path and server; an
    attempt's operation and model), with their encoding: made once per distinct set, not per span."""

    __slots__ = ("attributes", "encoded", "name", "name_field")

    def __init__(self, name: str, attributes: dict[str, Any]) -> None:
        self.name = name
        self.name_field = _field(0x2A, name.encode("utf-8", "replace"))
        self.attributes = attributes
        self.encoded = _attributes(0x4A, attributes)


FIXED_MAX = 1024  # the Fixed kept of each kind (chatgate.tracing.spans.Tracing)


# --- what the spans are ----------------------------------------------------------------------------

# an attempt that failed: span id, start, end, its Fixed, DeepSeek's status (if any), error.type
Failed = tuple[int, int, int, Fixed, int | None, str]


class ExchangeTrace(Protocol):
    """What the export thread reads of a request's trace (chatgate.tracing.spans.ExchangeTrace)."""

    trace_id: int
    span_id: int
    parent_id: int
    remote_parent: bool
    trace_state: str
    start: int
    end: int
    request_id: str
    server: Fixed | None
    record: UsageRecord | None
    status_code: int
    early_code: str | None
    rules: tuple[str, ...] | None
    attempt: tuple[int, int, Fixed] | None
    attempt_end: int
    failed: list[Failed] | None
    resp_id: str | None
    resp_model: str | None
    reasons: list[str] | None
    conversation: str | None
    first_chunk: float | None
    content: tuple[str | None, str | None] | None


class SpanRecord(NamedTuple):
    """A span: its name and the attributes it shares with others (`fixed`), and its own."""

    fixed: Fixed
    kind: int
    span_id: int
    parent_id: int
    remote_parent: bool
    start: int
    end: int
    own: dict[str, Any]  # the attributes beyond fixed's
    status: int

    @property
    def name(self) -> str:
        return self.fixed.name

    @property
    def attributes(self) -> dict[str, Any]:
        return {**self.fixed.attributes, **self.own}


def span_count(trace: ExchangeTrace) -> int:
    """The spans of a queued trace: its SERVER span, its failed attempts, its last attempt."""
    return 1 + (len(trace.failed) if trace.failed else 0) + (trace.attempt is not None)


def spans_count(traces: Iterable[ExchangeTrace]) -> int:
    return sum(map(span_count, traces))


def attempt_error(outcome: str, status: int, upstream_status: int | None) -> str | None:
    if upstream_status is not None and upstream_status >= 400:
        return str(upstream_status)
    if outcome == "ok":
        return None
    if outcome == "upstream_failed":
        return "timeout" if status == 504 else "upstream_failed"
    return outcome


def spans_of(t: ExchangeTrace) -> list[SpanRecord]:
    """The trace's spans, in the order they ended: each failed attempt, the last attempt, the request."""
    out = []
    for span_id, start, end, shared, code, error_type in t.failed or ():
        attrs: dict[str, Any] = {}
        if code is not None:
            attrs["http.response.status_code"] = code
        attrs["error.type"] = error_type
        out.append(SpanRecord(shared, CLIENT, span_id, t.span_id, False, start, end, attrs,
                              STATUS_ERROR))
    record, status = t.record, t.status_code
    if t.attempt is not None and record is not None:
        span_id, start, shared = t.attempt
        attrs = {}
        outcome = record.outcome
        if record.upstream_status is not None:
            attrs["http.response.status_code"] = record.upstream_status
        if t.resp_id is not None:
            attrs["gen_ai.response.id"] = t.resp_id
        if t.resp_model is not None or outcome == "ok":
            attrs["gen_ai.response.model"] = t.resp_model or record.model
        if t.reasons:
            attrs["gen_ai.response.finish_reasons"] = list(t.reasons)
        if t.first_chunk is not None:
            attrs["gen_ai.response.time_to_first_chunk"] = t.first_chunk
        if outcome in ("ok", "client_disconnected") or record.prompt_tokens or record.completion_tokens:
            attrs["gen_ai.usage.input_tokens"] = record.prompt_tokens
            attrs["gen_ai.usage.output_tokens"] = record.completion_tokens
            attrs["gen_ai.usage.cache_read.input_tokens"] = record.prompt_cache_hit_tokens
            attrs["gen_ai.usage.reasoning.output_tokens"] = record.reasoning_tokens
            if not record.tokens_exact:
                attrs["chatgate.tokens_exact"] = False
        attrs["chatgate.outcome"] = outcome
        error = attempt_error(outcome, status, record.upstream_status)
        if error is not None:
            attrs["error.type"] = error
        if t.content is not None:
            if t.content[0] is not None:
                attrs["gen_ai.input.messages"] = t.content[0]
            if t.content[1] is not None:
                attrs["gen_ai.output.messages"] = t.content[1]
        failed = error is not None and outcome != "client_disconnected"
        out.append(SpanRecord(shared, CLIENT, span_id, t.span_id, False, start, t.attempt_end, attrs,
                              STATUS_ERROR if failed else STATUS_UNSET))
    server = t.server
    assert server is not None  # a sampled trace's
    attrs = {"chatgate.request_id": t.request_id}
    if t.conversation is not None:
        attrs["gen_ai.conversation.id"] = t.conversation
    attrs["http.response.status_code"] = status
    if record is None:  # refused before its body was read (ExchangeTrace.early)
        attrs["error.type"] = str(status)
        attrs["chatgate.outcome"] = "refused"
        if t.early_code:
            attrs["chatgate.rules"] = [t.early_code]
    else:
        attrs["chatgate.outcome"] = record.outcome
        attrs["chatgate.team"] = record.team
        attrs["chatgate.key_id"] = record.key_id
        cost = "chatgate.cost_cny" if record.currency == "CNY" else "chatgate.cost_usd"
        attrs[cost] = record.cost_picousd / 1e12
        attrs["gen_ai.request.model"] = record.model
        if record.repairs:
            attrs["chatgate.repairs"] = record.repairs.split(",")
        if t.rules:
            attrs["chatgate.rules"] = list(t.rules)
        elif record.rule_code:
            attrs["chatgate.rules"] = [record.rule_code]
        if status >= 400:
            attrs["error.type"] = str(status)
    out.append(SpanRecord(server, SERVER, t.span_id, t.parent_id, t.remote_parent, t.start, t.end, attrs,
                          STATUS_ERROR if status >= 500 else STATUS_UNSET))
    return out


def readable(traces: Sequence[ExchangeTrace], resource: Any, scope: Any) -> list[Any]:
    """The spans as the SDK's ReadableSpans, for an exporter that encodes them itself (gRPC)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan

    kinds = {SERVER: trace.SpanKind.SERVER, CLIENT: trace.SpanKind.CLIENT}
    flags = trace.TraceFlags(FLAG_SAMPLED)
    out = []
    for t in traces:
        state = trace.TraceState.from_header([t.trace_state]) if t.trace_state else None
        for s in spans_of(t):
            ctx = trace.SpanContext(t.trace_id, s.span_id, False, flags, state)
            parent = trace.SpanContext(t.trace_id, s.parent_id, s.remote_parent, flags, state) \
                if s.parent_id else None
            code = trace.StatusCode.ERROR if s.status == STATUS_ERROR else trace.StatusCode.UNSET
            status = trace.Status(code)
            out.append(ReadableSpan(s.name, ctx, parent, resource, s.attributes, kind=kinds[s.kind],
                                    status=status, start_time=s.start, end_time=s.end,
                                    instrumentation_scope=scope))
    return out


# --- protobuf, by hand: only the fields chatgate sends ---------------------------------------------

_pack_double = struct.Struct("<d").pack
_pack_fixed32 = struct.Struct("<I").pack
_pack_u64 = struct.Struct(">Q").pack


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field (tag already shifted and typed)."""
    return bytes((tag,)) + _varint(len(payload)) + payload


def _any_value(value: Any) -> bytes:
    if isinstance(value, str):
        return _field(0x0A, value.encode("utf-8", "replace"))
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value & MASK64)
    if isinstance(value, float):
        return b"\x21" + _pack_double(value)
    if isinstance(value, (list, tuple)):
        return _field(0x2A, b"".join(_field(0x0A, _any_value(v)) for v in value))
    return _field(0x0A, str(value).encode("utf-8", "replace"))


def _entry(tag: int, head: bytes, value: Any) -> bytes:
    """A KeyValue (`head` its encoded key) in the repeated field `tag`."""
    body = head + _field(0x12, _any_value(value))
    return bytes((tag,)) + _varint(len(body)) + body


def _attributes(tag: int, attributes: Mapping[str, Any]) -> bytes:
    """Each attribute as a KeyValue in the repeated field `tag`."""
    return b"".join(_entry(tag, _field(0x0A, k.encode()), v) for k, v in attributes.items())


ENTRIES_MAX = 1024  # encoded entries kept by an Encoder for each attribute
# attributes whose values are new with every span: encoded each time, not kept
FRESH = frozenset(("chatgate.request_id", "gen_ai.response.id", "gen_ai.input.messages",
                   "gen_ai.output.messages"))

# trace_id, span_id; then (after the optional trace_state, parent, name) kind, start and end times
_IDS = struct.Struct(">2sQQ2sQ")  # the 16-byte trace id as two big-endian halves
_TIMES = struct.Struct("<BBBQBQ")
_FLAGS_LOCAL = b"\x85\x01" + _pack_fixed32(FLAG_SAMPLED | FLAG_HAS_REMOTE)
_FLAGS_REMOTE = b"\x85\x01" + _pack_fixed32(FLAG_SAMPLED | FLAG_HAS_REMOTE | FLAG_REMOTE)
_STATUS_FIELD = b"\x7a\x02\x18\x02"  # Status{code: ERROR}
_SPAN_HEADS = [b"\x12" + _varint(n) for n in range(4096)]  # ScopeSpans.spans, by the span's length


class Head:
    """What every export request of a process has alike: its resource, its scope, the schema URL."""

    __slots__ = ("resource", "schema", "scope")

    def __init__(self, resource: Mapping[str, Any], scope_name: str, scope_version: str, schema_url: str
                 ) -> None:
        scope = _field(0x0A, scope_name.encode())
        if scope_version:
            scope += _field(0x12, scope_version.encode())
        self.scope = _field(0x0A, scope)
        self.schema = _field(0x1A, schema_url.encode()) if schema_url else b""
        self.resource = _field(0x0A, _attributes(0x0A, resource))


class Encoder:
    """Spans (`spans_of`) as an OTLP ExportTraceServiceRequest. A span's name and shared attributes come
    encoded with its Fixed; each attribute entry of its own that repeats from request to request (a status,
    the model, a team, a token count, a finish reason) is encoded once and kept (ENTRIES_MAX, the oldest
    out first); floats and the values in FRESH are encoded each time."""

    def __init__(self, head: Head) -> None:
        self.head = head
        # by attribute, its encoded entries by value (a list's by its tuple), made the first time
        self._entries: dict[str, BoundedDict[Any, bytes]] = {}
        self._keys: dict[str, bytes] = {}  # an attribute's encoded key (chatgate's names: a few dozen)

    def entry(self, key: str, value: Any) -> bytes:
        """The attribute as an encoded Span.attributes entry."""
        head = self._keys.get(key)
        if head is None:
            head = self._keys[key] = _field(0x0A, key.encode())
        if type(value) is float:  # its length does not depend on the value
            return b"\x4a" + _varint(len(head) + 11) + head + b"\x12\x09\x21" + _pack_double(value)
        if key in FRESH:
            raw = value.encode("utf-8", "replace") if type(value) is str else b""
            n = len(raw)
            if raw and n < 0x7C - len(head):  # every length fits in one byte
                return (b"\x4a" + bytes((len(head) + n + 4,)) + head + b"\x12" + bytes((n + 2,)) + b"\x0a"
                        + bytes((n,)) + raw)
            return _entry(0x4A, head, value)
        kept = self._entries.get(key)
        if kept is None:
            kept = self._entries[key] = BoundedDict(ENTRIES_MAX)
        found = kept[tuple(value) if type(value) is list else value] = _entry(0x4A, head, value)
        return found

    def _trace(self, t: ExchangeTrace, out: list[bytes]) -> None:
        """The trace's spans as ScopeSpans.spans fields, appended to `out`."""
        hi, lo = t.trace_id >> 64, t.trace_id & MASK64
        state = _field(0x1A, t.trace_state.encode("ascii", "replace")) if t.trace_state else b""
        entries = self._entries
        for s in spans_of(t):
            fixed = s.fixed
            parts = [_IDS.pack(b"\x0a\x10", hi, lo, b"\x12\x08", s.span_id), state,
                     b"\x22\x08" + _pack_u64(s.parent_id) if s.parent_id else b"", fixed.name_field,
                     _TIMES.pack(0x30, s.kind, 0x39, s.start, 0x41, s.end), fixed.encoded]
            for key, value in s.own.items():
                kept = entries.get(key)
                found = None if kept is None else kept.get(tuple(value) if type(value) is list else value)
                parts.append(self.entry(key, value) if found is None else found)
            if s.status == STATUS_ERROR:
                parts.append(_STATUS_FIELD)
            parts.append(_FLAGS_REMOTE if s.remote_parent else _FLAGS_LOCAL)
            body = b"".join(parts)
            n = len(body)
            out.append(_SPAN_HEADS[n] if n < 4096 else b"\x12" + _varint(n))
            out.append(body)

    def request(self, traces: Iterable[ExchangeTrace]) -> bytes:
        """An ExportTraceServiceRequest: one resource, one instrumentation scope, the traces' spans."""
        head = self.head
        spans: list[bytes] = []
        for t in traces:
            self._trace(t, spans)
        scope_len = len(head.scope) + sum(map(len, spans)) + len(head.schema)
        scope_head = b"\x12" + _varint(scope_len)  # ResourceSpans.scope_spans
        resource_len = len(head.resource) + len(scope_head) + scope_len + len(head.schema)
        return b"".join((b"\x0a", _varint(resource_len), head.resource, scope_head, head.scope, *spans,
                         head.schema, head.schema))
