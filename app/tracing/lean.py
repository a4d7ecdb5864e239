"""chatgate's spans as plain records, and their OTLP protobuf encoding.

The SDK's `Span` validates every attribute as it is set (~38 µs a span of twenty attributes) and its OTLP
encoder builds a protobuf object per attribute (~90 µs a span): together more than half of what chatgate
spends on a request. chatgate knows its attributes' types, so the request path records a `LeanSpan` (ids,
times, a dict) and hands it to the SDK's BatchSpanProcessor; its thread exports the batch, encoded here
(about a tenth of the SDK encoder's cost) and POSTed by the official OTLP/HTTP exporter's client, or, for
any other exporter (gRPC), as the SDK's own `ReadableSpan`s.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

SERVER, CLIENT = 2, 3  # OTLP's Span.SpanKind
STATUS_UNSET, STATUS_ERROR = 0, 2
FLAG_SAMPLED = 0x01
FLAG_HAS_REMOTE, FLAG_REMOTE = 0x100, 0x200  # Span.flags: whether the parent is known to be remote


class _Sampled:
    """What the SDK's BatchSpanProcessor asks of a span before it queues it (`span.context.trace_flags`)."""

    class trace_flags:
        sampled = True


class LeanSpan:
    __slots__ = ("attributes", "end", "fixed", "kind", "name", "parent_id", "remote_parent", "span_id",
                 "start", "status", "trace_id", "trace_state")
    context = _Sampled  # only sampled spans are recorded

    def __init__(self, name: str, kind: int, trace_id: int, span_id: int, parent_id: int,
                 remote_parent: bool, trace_state: str, start: int, end: int, attributes: dict[str, Any],
                 status: int, fixed: Fixed | None = None) -> None:
        self.name = name
        self.kind = kind
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent_id
        self.remote_parent = remote_parent
        self.trace_state = trace_state
        self.start = start
        self.end = end
        self.attributes = attributes
        self.status = status
        self.fixed = fixed  # attributes many spans share, encoded once


class Fixed:
    """Attributes that many spans have alike (a route's method, path and server; an attempt's operation and
    model), with their encoding: made once per distinct set (`fixed`), not per span."""

    __slots__ = ("attributes", "encoded")

    def __init__(self, attributes: dict[str, Any]) -> None:
        self.attributes = attributes
        self.encoded = _attributes(0x4A, attributes)


_FIXED: dict[tuple[Any, ...], Fixed] = {}
FIXED_MAX = 1024


def fixed(key: tuple[Any, ...], make: Callable[[], dict[str, Any]]) -> Fixed:
    """The Fixed for `key` (made by `make` the first time); bounded, and cleared when full."""
    found = _FIXED.get(key)
    if found is None:
        if len(_FIXED) >= FIXED_MAX:
            _FIXED.clear()
        found = _FIXED[key] = Fixed(make())
    return found


# --- protobuf, by hand: only the fields chatgate sends --------------------------------------------------

_pack_double = struct.Struct("<d").pack
_pack_fixed64 = struct.Struct("<Q").pack
_pack_fixed32 = struct.Struct("<I").pack


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
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _pack_double(value)
    if isinstance(value, (list, tuple)):
        return _field(0x2A, b"".join(_field(0x0A, _any_value(v)) for v in value))
    return _field(0x0A, str(value).encode("utf-8", "replace"))


_KEYS: dict[str, bytes] = {}
# KeyValues already encoded, by (key, value) for str and int values: most repeat from span to span (the
# method, route, team, key, model, status); bounded, and cleared when full.
_KV: dict[tuple[Any, ...], bytes] = {}
KV_CACHE_MAX = 8192


def _kv(key: str, value: Any) -> bytes:
    """A KeyValue message, its length first."""
    head = _KEYS.get(key)
    if head is None:
        head = _KEYS[key] = _field(0x0A, key.encode())
    body = head + _field(0x12, _any_value(value))
    return _varint(len(body)) + body


UNIQUE = frozenset({"chatgate.request_id", "gen_ai.response.id"})  # new with every span: not cached


def _attributes(tag: int, attributes: Mapping[str, Any]) -> bytes:
    """Each attribute as a KeyValue in the repeated field `tag`."""
    lead = bytes((tag,))
    cache = _KV
    out = []
    for item in attributes.items():
        value = item[1]
        kind = type(value)
        if (kind is str or kind is int) and item[0] not in UNIQUE:
            kv = cache.get(item)
            if kv is None:
                if len(cache) >= KV_CACHE_MAX:
                    cache.clear()
                kv = cache[item] = _kv(*item)
        elif kind is list and len(value) == 1 and type(value[0]) is str:  # a finish reason, a rule, a repair
            one = (item[0], value[0], list)
            kv = cache.get(one)
            if kv is None:
                if len(cache) >= KV_CACHE_MAX:
                    cache.clear()
                kv = cache[one] = _kv(*item)
        else:
            kv = _kv(*item)
        out.append(lead + kv)
    return b"".join(out)


# trace_id, span_id; then (after the optional trace_state, parent, name) kind, start and end times
_IDS = struct.Struct(">2sQQ2sQ")  # the 16-byte trace id as two big-endian halves
_TIMES = struct.Struct("<BBBQBQ")


def encode_span(span: LeanSpan) -> bytes:
    trace_id = span.trace_id
    parts = [_IDS.pack(b"\x0a\x10", trace_id >> 64, trace_id & 0xFFFFFFFFFFFFFFFF, b"\x12\x08", span.span_id)]
    if span.trace_state:
        parts.append(_field(0x1A, span.trace_state.encode("ascii", "replace")))
    if span.parent_id:
        parts.append(b"\x22\x08" + span.parent_id.to_bytes(8, "big"))
    name = _NAMES.get(span.name)
    if name is None:
        if len(_NAMES) >= 1024:
            _NAMES.clear()
        name = _NAMES[span.name] = _field(0x2A, span.name.encode("utf-8", "replace"))
    parts.append(name)
    parts.append(_TIMES.pack(0x30, span.kind, 0x39, span.start, 0x41, span.end))
    if span.fixed is not None:
        parts.append(span.fixed.encoded)
    parts.append(_attributes(0x4A, span.attributes))
    if span.status:
        parts.append(b"\x7a\x02\x18" + bytes((span.status,)))
    parts.append(_FLAGS_REMOTE if span.remote_parent else _FLAGS_LOCAL)
    return b"".join(parts)


_NAMES: dict[str, bytes] = {}  # span names: a route's, an operation and model's (bounded by the routes and
# the models profiled; a client's model name is cut to 200 characters and the dict is cleared past 1024)
_FLAGS_LOCAL = b"\x85\x01" + _pack_fixed32(FLAG_SAMPLED | FLAG_HAS_REMOTE)
_FLAGS_REMOTE = b"\x85\x01" + _pack_fixed32(FLAG_SAMPLED | FLAG_HAS_REMOTE | FLAG_REMOTE)


def encode_request(spans: Iterable[LeanSpan], resource: Mapping[str, Any], scope_name: str,
                   scope_version: str, schema_url: str) -> bytes:
    """An ExportTraceServiceRequest: one resource, one instrumentation scope, the spans."""
    scope = _field(0x0A, scope_name.encode())
    if scope_version:
        scope += _field(0x12, scope_version.encode())
    body = b"".join(_field(0x12, encode_span(s)) for s in spans)
    scope_spans = _field(0x0A, scope) + body + (_field(0x1A, schema_url.encode()) if schema_url else b"")
    resource_spans = (_field(0x0A, _attributes(0x0A, resource)) + _field(0x12, scope_spans)
                      + (_field(0x1A, schema_url.encode()) if schema_url else b""))
    return _field(0x0A, resource_spans)


def readable(spans: Sequence[LeanSpan], resource: Any, scope: Any) -> list[Any]:
    """The spans as the SDK's ReadableSpans, for an exporter that encodes them itself (gRPC)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan

    kinds = {SERVER: trace.SpanKind.SERVER, CLIENT: trace.SpanKind.CLIENT}
    out = []
    for s in spans:
        state = trace.TraceState.from_header([s.trace_state]) if s.trace_state else None
        ctx = trace.SpanContext(s.trace_id, s.span_id, False, trace.TraceFlags(FLAG_SAMPLED), state)
        parent = trace.SpanContext(s.trace_id, s.parent_id, s.remote_parent, trace.TraceFlags(FLAG_SAMPLED),
                                   state) if s.parent_id else None
        status = trace.Status(trace.StatusCode.ERROR if s.status == STATUS_ERROR else trace.StatusCode.UNSET)
        attributes = {**s.fixed.attributes, **s.attributes} if s.fixed is not None else s.attributes
        out.append(ReadableSpan(s.name, ctx, parent, resource, attributes, kind=kinds[s.kind],
                                status=status, start_time=s.start, end_time=s.end,
                                instrumentation_scope=scope))
    return out
