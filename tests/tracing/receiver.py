"""A real OTLP/HTTP trace receiver for the tests: `POST /v1/traces` with a protobuf
ExportTraceServiceRequest, decoded with opentelemetry-proto into plain spans."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

SERVER, CLIENT = 2, 3  # Span.SpanKind
STATUS_ERROR = 2


@dataclass
class Span:
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    status: int
    resource: dict[str, Any]
    schema_url: str
    start_ns: int
    end_ns: int


def value_of(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [value_of(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: value_of(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, which) if which else None


@dataclass
class Receiver:
    url: str
    spans: list[Span] = field(default_factory=list)
    posts: int = 0
    lock: threading.Condition = field(default_factory=threading.Condition)

    def take(self, request: ExportTraceServiceRequest) -> None:
        found = []
        for rs in request.resource_spans:
            resource = {kv.key: value_of(kv.value) for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    attributes = {kv.key: value_of(kv.value) for kv in s.attributes}
                    found.append(Span(s.name, s.kind, s.trace_id.hex(), s.span_id.hex(),
                                      s.parent_span_id.hex(), attributes, s.status.code,
                                      resource, ss.schema_url, s.start_time_unix_nano, s.end_time_unix_nano))
        with self.lock:
            self.spans += found
            self.posts += 1
            self.lock.notify_all()

    def trace(self, trace_id: str, count: int, timeout: float = 10) -> list[Span]:
        """The spans of one trace, once `count` of them arrived."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                got = [s for s in self.spans if s.trace_id == trace_id]
                if len(got) >= count:
                    return got
                if not self.lock.wait(max(0.0, deadline - time.monotonic())):
                    raise AssertionError(f"{len(got)} span(s) of trace {trace_id} arrived, not {count}")

    def by_request(self, request_id: str, count: int, timeout: float = 10) -> list[Span]:
        """The spans of the trace whose SERVER span's request had this x-request-id."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                server = next((s for s in self.spans if s.kind == SERVER
                               and s.attributes.get("chatgate.request_id") == request_id), None)
                if server is not None:
                    break
                if not self.lock.wait(max(0.0, deadline - time.monotonic())):
                    raise AssertionError(f"no SERVER span for request {request_id}")
        return self.trace(server.trace_id, count, max(0.1, deadline - time.monotonic()))


@contextmanager
def run_receiver() -> Iterator[Receiver]:
    receiver: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
                self.send_response(404)
                self.end_headers()
                return
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            receiver.take(request)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = Receiver(f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
