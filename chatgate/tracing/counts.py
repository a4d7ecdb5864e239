"""What the exporter delivered and what was dropped, for /metrics."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from chatgate.tracing.queue import ExportQueue

log = logging.getLogger("chatgate.tracing")


class CountingExporter:
    """The OTLP exporter, counting the spans of the exports that failed (the exporter was down). Its items
    are requests' traces: `count` says how many spans they are."""

    def __init__(self, inner: Any, count: Callable[[Sequence[Any]], int] = len) -> None:
        self.inner = inner
        self.count = count
        self.failed = 0
        self.exported = 0

    def export(self, items: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        try:
            result = self.inner.export(items)
        except Exception as exc:  # an exporter bug must not kill the processor's thread
            log.warning("exporting %d trace(s) failed: %s", len(items), exc)
            result = SpanExportResult.FAILURE
        if result == SpanExportResult.SUCCESS:
            self.exported += self.count(items)
        else:
            self.failed += self.count(items)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


class TraceCounts:
    """Spans exported, and dropped: the export queue was full (the oldest trace is dropped), or the export
    failed."""

    def __init__(self, exporter: CountingExporter, queue: ExportQueue[Any]) -> None:
        self.exporter = exporter
        self.queue = queue

    @property
    def queue_full(self) -> int:
        return self.queue.queue_full

    @property
    def dropped(self) -> int:
        return self.queue_full + self.exporter.failed


class TraceCollector(Collector):
    def __init__(self, counts: TraceCounts) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("chatgate_trace_spans_exported", "Spans the OTLP exporter delivered",
                                  value=self.counts.exporter.exported)
        family = CounterMetricFamily("chatgate_trace_spans_dropped",
                                     "Spans dropped: the export queue was full, or the export failed",
                                     labels=["reason"])
        family.add_metric(["queue_full"], self.counts.queue_full)
        family.add_metric(["export_failed"], self.counts.exporter.failed)
        yield family
