"""Whether tracing is on, and the SDK's provider, batch processor and OTLP exporter when it is.

On when `tracing.enabled` is true, or unset and OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (and OTEL_SDK_DISABLED is not true). The `[tracing]` settings win
over the OTEL_* variables; the SDK reads the rest of them itself (OTEL_RESOURCE_ATTRIBUTES,
OTEL_TRACES_SAMPLER and its argument, OTEL_EXPORTER_OTLP_HEADERS, ...). Spans wait in the batch processor's
bounded queue and are exported by its thread: an exporter that is down or slow costs a request nothing,
and what does not fit in the queue or fails to export is counted (`chatgate_trace_spans_dropped_total`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from app.settings import TracingSettings
from app.tracing.counts import CountingExporter, TraceCounts
from app.tracing.spans import Tracing

log = logging.getLogger("chatgate.tracing")

SCHEMA_URL = "https://opentelemetry.io/schemas/1.44.0"  # the semantic conventions the spans follow
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOL_VARS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


def tracing_on(settings: TracingSettings, env: Mapping[str, str]) -> bool:
    if settings.enabled is not None:
        return settings.enabled
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(env.get(name) for name in ENDPOINT_VARS)


def protocol_of(settings: TracingSettings, env: Mapping[str, str]) -> str:
    if settings.protocol is not None:
        return settings.protocol
    for name in PROTOCOL_VARS:
        if env.get(name):
            return env[name].strip()
    return "http/protobuf"


def build_tracing(settings: TracingSettings, env: Mapping[str, str] | None = None) -> Tracing | None:
    """The tracing of this process, or None when it is off (nothing of the SDK is imported then)."""
    env = os.environ if env is None else env
    if not tracing_on(settings, env):
        return None
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    attributes: dict[str, Any] = {}
    if settings.service_name is not None:
        attributes[SERVICE_NAME] = settings.service_name
    elif not env.get("OTEL_SERVICE_NAME") and "service.name=" not in env.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        attributes[SERVICE_NAME] = "chatgate"
    resource = Resource.create(attributes)  # + OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME
    sampler = ParentBased(TraceIdRatioBased(settings.sample_ratio)) if settings.sample_ratio is not None \
        else None  # None: the SDK's OTEL_TRACES_SAMPLER (parentbased_always_on by default)
    provider = TracerProvider(resource=resource, sampler=sampler)
    counts = TraceCounts(CountingExporter(_exporter(settings, env)))
    provider.add_span_processor(_processor(counts, settings))
    tracer = provider.get_tracer("chatgate", schema_url=SCHEMA_URL)
    return Tracing(provider, tracer, counts, settings.capture_content)


def _exporter(settings: TracingSettings, env: Mapping[str, str]) -> Any:
    protocol = protocol_of(settings, env)
    timeout = settings.export_timeout_seconds
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
        except ImportError:
            raise RuntimeError("OTLP over gRPC needs the grpc exporter: pip install 'chatgate[otlp-grpc]' "
                               "(or use http/protobuf, the default)") from None
        return Grpc(endpoint=settings.endpoint, timeout=timeout)
    if protocol != "http/protobuf":
        raise RuntimeError(f"OTLP protocol {protocol!r} is not supported: use http/protobuf or grpc")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    endpoint = settings.endpoint
    if endpoint is not None and not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"  # a base URL, as OTEL_EXPORTER_OTLP_ENDPOINT is
    return Http(endpoint=endpoint, timeout=timeout)


def _processor(counts: TraceCounts, settings: TracingSettings) -> Any:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    class CountingProcessor(BatchSpanProcessor):
        def on_end(self, span: Any) -> None:
            counts.before_queue()
            super().on_end(span)

    batch = min(512, settings.max_queue_size)
    processor = CountingProcessor(counts.exporter, max_queue_size=settings.max_queue_size,  # type: ignore[arg-type]
                                  max_export_batch_size=batch,
                                  export_timeout_millis=settings.export_timeout_seconds * 1000)
    counts.watch(processor)
    return processor
