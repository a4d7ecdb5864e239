"""chatgate's own OTLP encoding (chatgate/tracing/lean.py) against what the spans are (`spans_of`, also what
the gRPC exporter gets): every request shape, decoded with opentelemetry-proto, span by span."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from chatgate.settings import TracingSettings
from chatgate.store.base import UsageRecord
from chatgate.tracing.lean import Encoder, readable, span_count, spans_of
from chatgate.tracing.queue import ExportQueue
from chatgate.tracing.setup import SCHEMA_URL, build_tracing, http_client
from chatgate.tracing.spans import ExchangeTrace, Tracing
from tests.tracing.receiver import Receiver

ROUTE = "/v1/chat/completions"
SCOPE: dict[str, Any] = {
    "headers": [(b"host", b"127.0.0.1:8787"), (b"user-agent", b"agent/1.0")], "client": ("10.0.0.7", 50000),
    "server": ("127.0.0.1", 8787), "path": ROUTE, "scheme": "http", "http_version": "1.1"}
HEADERS = [(b"content-type", b"application/json")]
OK = UsageRecord("r", 0.0, "req", "key_1", "k", "agents", "deepseek-v4-flash", ROUTE, False, "ok",
                 upstream_status=200, prompt_tokens=1200, completion_tokens=300, prompt_cache_hit_tokens=1024,
                 prompt_cache_miss_tokens=176, reasoning_tokens=200, cost_picousd=123456789)
FAILED = replace(OK, upstream_status=None, prompt_tokens=0, completion_tokens=0, prompt_cache_hit_tokens=0,
                 reasoning_tokens=0, cost_picousd=0)


class Problem:
    def __init__(self, rule: str | None, code: str) -> None:
        self.rule, self.code = rule, code


@pytest.fixture
def tracing() -> Iterator[tuple[Tracing, list[ExchangeTrace]]]:
    t = build_tracing(TracingSettings(enabled=True, endpoint="http://127.0.0.1:9"))
    assert t is not None
    queued: list[ExchangeTrace] = []
    t._put = queued.append
    yield t, queued
    t.shutdown(0)


def plain(t: Tracing) -> None:
    tr = t.start("POST", ROUTE, ROUTE, SCOPE, "req-plain")
    tr.max_tokens = 64
    tr.start_attempt(HEADERS, "deepseek-v4-flash", False)
    tr.answer({"id": "chatcmpl-1", "model": "deepseek-v4-flash",
               "choices": [{"finish_reason": "tool_calls"}]})
    tr.finish(OK, 200)


def continued_stream(t: Tracing) -> None:
    parent = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    context = [(b"traceparent", parent), (b"tracestate", b"vendor=opaque")]
    scope = {**SCOPE, "headers": [*SCOPE["headers"], *context]}
    tr = t.start("POST", ROUTE, ROUTE, scope, "req-stream")
    tr.start_attempt(HEADERS, "deepseek-v4-flash", True)
    tr.feed(b'data: {"id":"chatcmpl-s","model":"deepseek-v4-flash","choices":[{"delta":{}}]}\n\n')
    tr.feed(b'data: {"choices":[{"finish_reason":"stop"},{"finish_reason":"length"}]}\n\ndata: [DONE]\n\n')
    tr.finish(replace(OK, stream=True, tokens_exact=False, repairs="R5,A3"), 200)


def refused(t: Tracing) -> None:
    tr = t.start("POST", ROUTE, ROUTE, SCOPE, "req-refused")
    tr.refused([Problem("R5", "invalid_role"), Problem(None, "bad_thing")])
    tr.finish(replace(FAILED, outcome="rejected", rule_code="R5"), 400)


def early(t: Tracing) -> None:
    tr = t.start("POST", ROUTE, ROUTE, {**SCOPE, "client": None, "server": None}, "req-early")
    tr.early(413, "too_big")


def retried(t: Tracing) -> None:
    tr = t.start("POST", "/beta/completions", "/beta/completions", SCOPE, "req-retried")
    tr.start_attempt(HEADERS, "deepseek-v4-flash", False)
    tr.attempt_failed("503", 503)
    tr.start_attempt(HEADERS, "deepseek-v4-flash", False)
    tr.attempt_failed("timeout")
    tr.start_attempt(HEADERS, "deepseek-v4-flash", False)
    tr.answer({"id": "cmpl-1", "choices": [{"finish_reason": "length"}]})
    tr.finish(replace(OK, route="/beta/completions", attempts=3), 200)


def upstream_errors(t: Tracing) -> None:
    for status, outcome, upstream in ((422, "upstream_error", 422), (502, "upstream_failed", None),
                                      (504, "upstream_failed", None), (499, "client_disconnected", 200)):
        tr = t.start("POST", ROUTE, ROUTE, SCOPE, f"req-{status}")
        tr.start_attempt(HEADERS, "deepseek-v4-flash", True)
        tr.finish(replace(FAILED, outcome=outcome, upstream_status=upstream,
                          completion_tokens=7 if upstream == 200 else 0), status)


def anthropic_with_content(t: Tracing) -> None:
    tr = t.start("POST", "/anthropic/v1/messages", "/anthropic/v1/messages", SCOPE, "req-anthropic")
    tr.start_attempt(HEADERS, "deepseek-v4-pro", False)
    tr.answer({"id": "msg_1", "model": "deepseek-v4-pro", "stop_reason": "end_turn", "content": []})
    tr.finish(replace(OK, model="deepseek-v4-pro"), 200,
              {"system": "be brief", "messages": [{"role": "user", "content": "x" * 300}]}, "hello")


def responses(t: Tracing) -> None:
    tr = t.start("POST", "/v1/responses", "/v1/responses", SCOPE, "req-responses-" + "r" * 200)
    tr.start_attempt(HEADERS, "deepseek-v4-flash", False)
    tr.answer({"id": "resp_1", "model": "deepseek-v4-flash", "status": "completed", "output": []})
    tr.finish(OK, 200, None, "answer")


SHAPES = [plain, continued_stream, refused, early, retried, upstream_errors, anthropic_with_content,
          responses]


def decoded(data: bytes) -> list[Any]:
    got = Receiver("encoded")
    got.take(ExportTraceServiceRequest.FromString(data))
    return got.spans


@pytest.mark.parametrize("shape", SHAPES, ids=[s.__name__ for s in SHAPES])
def test_the_encoding_is_the_spans(tracing: tuple[Tracing, list[ExchangeTrace]], shape: Any) -> None:
    t, queued = tracing
    shape(t)
    assert queued
    exporter = t.counts.exporter.inner
    data = exporter.encoder.request(queued)
    wanted = [(tr, s) for tr in queued for s in spans_of(tr)]
    got = decoded(data)
    assert len(got) == len(wanted) == sum(map(span_count, queued))
    for span, (tr, s) in zip(got, wanted, strict=True):
        assert span.name == s.name and span.kind == s.kind
        assert span.trace_id == f"{tr.trace_id:032x}" and span.span_id == f"{s.span_id:016x}"
        assert span.parent_id == (f"{s.parent_id:016x}" if s.parent_id else "")
        assert span.attributes == s.attributes
        assert span.status == s.status and (span.start_ns, span.end_ns) == (s.start, s.end)
        assert span.schema_url == SCHEMA_URL and span.resource["service.name"] == "chatgate"
    # and what the gRPC exporter gets: the same spans as the SDK's ReadableSpans
    sdk = readable(queued, exporter.resource, exporter.scope)
    assert [(r.name, dict(r.attributes or {})) for r in sdk] == [(s.name, s.attributes) for _, s in wanted]


def test_a_whole_batch_is_one_request_of_every_span(tracing: tuple[Tracing, list[ExchangeTrace]]) -> None:
    t, queued = tracing
    for shape in SHAPES * 40:
        shape(t)
    encoder: Encoder = t.counts.exporter.inner.encoder
    assert len(decoded(encoder.request(queued))) == sum(map(span_count, queued)) > 700


def test_a_full_queue_counts_the_spans_of_the_trace_it_drops(tracing: tuple[Tracing, list[ExchangeTrace]]
                                                             ) -> None:
    t, queued = tracing
    retried(t)
    plain(t)
    plain(t)
    exported: list[list[ExchangeTrace]] = []
    queue = ExportQueue(Batches(exported), span_count, 2, 2, 3600.0)
    for trace in queued:
        queue.put(trace)
    assert queue.queue_full == 4  # the retried request, the oldest: three attempts and its SERVER span
    assert len(queue) == 2
    assert queue.force_flush(1000) and exported == [queued[1:]]
    queue.shutdown()


class Batches:
    def __init__(self, batches: list[list[ExchangeTrace]]) -> None:
        self.batches = batches
        self.stopped = False

    def export(self, items: Sequence[ExchangeTrace]) -> object:
        self.batches.append(list(items))
        return None

    def shutdown(self) -> None:
        self.stopped = True


def test_the_queue_exports_in_batches_from_its_thread_and_stops_with_a_last_flush(
        tracing: tuple[Tracing, list[ExchangeTrace]]) -> None:
    t, queued = tracing
    for _ in range(7):
        plain(t)
    exported: list[list[ExchangeTrace]] = []
    exporter = Batches(exported)
    queue = ExportQueue(exporter, span_count, 100, 3, 3600.0)
    for trace in queued[:6]:
        queue.put(trace)  # two full batches: the thread is woken
    deadline = time.monotonic() + 5
    while sum(map(len, exported)) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert exported == [queued[0:3], queued[3:6]]
    queue.put(queued[6])  # under a batch: it waits for the delay, or the stop
    queue.shutdown()
    assert exported[-1] == [queued[6]] and exporter.stopped and queue.queue_full == 0


def test_the_queue_holds_requests_of_two_spans() -> None:
    t = build_tracing(TracingSettings(enabled=True, endpoint="http://127.0.0.1:9", max_queue_size=100))
    assert t is not None
    assert t.queue.max_items == 50 and t.queue.batch == 50
    t.shutdown(0)


def test_a_streams_finish_reasons_are_found_whatever_else_its_events_say(
        tracing: tuple[Tracing, list[ExchangeTrace]]) -> None:
    """Chat, FIM and Anthropic streams: the last three reads, scanned once at the end (a reason cut between
    two reads too); the Responses API: each read that has a final event's type."""
    t, queued = tracing
    delta = b'data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}]}\n\n'
    streams: list[tuple[str, list[bytes], list[str]]] = [
        (ROUTE, [delta] * 20 + [b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n',
                                b'data: {"choices":[],"usage":{}}\n\n', b"data: [DONE]\n\n"], ["stop"]),
        (ROUTE, [delta, b'data: {"choices":[{"delta":{}, "finish_reason": "len', b'gth"}]}\n\n'], ["length"]),
        (ROUTE, [delta, b'data: {"choices":[{"index":0,"finish_reason":"stop"},'
                        b'{"index":1,"finish_reason":null}]}\n\n'
                        b'data: {"choices":[{"index":1,"finish_reason":"length"}]}\n\n'], ["stop", "length"]),
        (ROUTE, [delta] * 3, []),
        ("/anthropic/v1/messages", [b'event: message_start\ndata: {"message":{"stop_reason":null}}\n\n',
                                    b'data: {"type":"message_delta","delta":{"stop_reason":"end_turn"}}\n\n',
                                    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'], ["end_turn"]),
        ("/v1/responses", [b'data: {"type":"response.output_text.delta","delta":"x"}\n\n',
                           b'data: {"type":"response.incomplete","response":{"output":"' + b"x" * 5000,
                           b"y" * 5000, b'"}}\n\n', b"z" * 100], ["incomplete"]),
    ]
    for route, reads, reasons in streams:
        tr = t.start("POST", route, route, SCOPE, "req-feed")
        tr.start_attempt(HEADERS, "deepseek-v4-flash", True)
        for read in reads:
            tr.feed(read)
        tr.finish(replace(OK, stream=True), 200)
        assert (tr.reasons or []) == reasons, (route, reads[-1])
    got = decoded(t.counts.exporter.inner.encoder.request(queued))
    assert got[0].attributes["gen_ai.response.finish_reasons"] == ["stop"]


def test_the_pinned_otlp_http_exporter_takes_chatgates_encoding() -> None:
    """The exporter's client is not a public API (pyproject.toml bounds the exporter): on the version
    installed, chatgate hands it the request it encoded itself; a client without `export` is not used."""
    t = build_tracing(TracingSettings(enabled=True, endpoint="http://127.0.0.1:9"))
    assert t is not None
    lean = t.counts.exporter.inner
    assert lean._client is not None and lean._client is lean.inner._client
    t.shutdown(0)

    class Other:
        _client = object()
    Other.__module__ = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
    assert http_client(Other()) is None
