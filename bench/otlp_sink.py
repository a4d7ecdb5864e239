"""A live OTLP/HTTP trace receiver for benchmarks: `POST /v1/traces`, the protobuf decoded (as a collector
would), spans counted; prints the count every 10 s and when stopped.

    python -m bench.otlp_sink --port 4318 &
    python -m bench.pair --env-b CHATGATE_TRACING_ENABLED=true \\
        --env-b CHATGATE_TRACING_ENDPOINT=http://127.0.0.1:4318     # tracing off / on, c=16
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

ANSWER = ExportTraceServiceResponse().SerializeToString()


def main(argv: list[str] | None = None) -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--port", type=int, default=4318)
    args = parser.parse_args(argv)
    counts = {"spans": 0, "posts": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a collector serves

        def do_POST(self) -> None:
            request = ExportTraceServiceRequest()
            request.ParseFromString(self.rfile.read(int(self.headers.get("content-length", 0))))
            n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
            with lock:
                counts["spans"] += n
                counts["posts"] += 1
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(ANSWER)))
            self.end_headers()
            self.wfile.write(ANSWER)

        def log_message(self, *a: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True  # an exporter's kept-alive connection does not hold the exit
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())

    def report() -> None:
        while True:
            time.sleep(10)
            print(f"otlp_sink: {counts['spans']} spans in {counts['posts']} exports", flush=True)

    threading.Thread(target=report, daemon=True).start()
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    print(f"otlp_sink: {counts['spans']} spans in {counts['posts']} exports", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
