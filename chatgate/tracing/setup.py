"""Whether tracing is on, and the export queue and the OTLP exporter when it is.

On when `tracing.enabled` is true, or unset and OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (and OTEL_SDK_DISABLED is not true). The `[tracing]` settings win
over the OTEL_* variables; the SDK reads the rest of them itself (OTEL_RESOURCE_ATTRIBUTES,
OTEL_TRACES_SAMPLER and its argument, OTEL_EXPORTER_OTLP_HEADERS, ...). Spans wait in a bounded queue
and are exported by its thread (chatgate.tracing.queue): an exporter that is down or slow costs a request
nothing, and what does not fit in the queue or fails to export is counted
(`chatgate_trace_spans_dropped_total`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from chatgate.settings import TracingSettings
from chatgate.tracing.counts import CountingExporter, TraceCounts
from chatgate.tracing.lean import Encoder, Head, readable, span_count, spans_count
from chatgate.tracing.queue import ExportQueue
from chatgate.tracing.spans import ExchangeTrace, Tracing

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


SAMPLERS = {"always_on": (False, 1.0), "always_off": (False, 0.0), "traceidratio": (False, None),
            "parentbased_always_on": (True, 1.0), "parentbased_always_off": (True, 0.0),
            "parentbased_traceidratio": (True, None)}


def sampler_of(settings: TracingSettings, env: Mapping[str, str]) -> tuple[bool, float]:
    """(parent based, ratio of new traces sampled): `tracing.sample_ratio`, else OTEL_TRACES_SAMPLER and
    OTEL_TRACES_SAMPLER_ARG (the SDK's six standard samplers), else parentbased_always_on."""
    if settings.sample_ratio is not None:
        return True, settings.sample_ratio
    name = env.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_always_on"
    if name not in SAMPLERS:
        log.warning("OTEL_TRACES_SAMPLER=%s is not one chatgate knows (%s): parentbased_always_on", name,
                    ", ".join(SAMPLERS))
        name = "parentbased_always_on"
    parent_based, ratio = SAMPLERS[name]
    if ratio is None:
        try:
            ratio = min(max(float(env.get("OTEL_TRACES_SAMPLER_ARG", "1.0")), 0.0), 1.0)
        except ValueError:
            ratio = 1.0
    return parent_based, ratio


def build_tracing(settings: TracingSettings, env: Mapping[str, str] | None = None) -> Tracing | None:
    """The tracing of this process, or None when it is off (nothing of the SDK is imported then)."""
    env = os.environ if env is None else env
    if not tracing_on(settings, env):
        return None
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    attributes: dict[str, Any] = {}
    if settings.service_name is not None:
        attributes[SERVICE_NAME] = settings.service_name
    elif not env.get("OTEL_SERVICE_NAME") and "service.name=" not in env.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        attributes[SERVICE_NAME] = "chatgate"
    resource = Resource.create(attributes)  # + OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME
    scope = InstrumentationScope("chatgate", _version(), SCHEMA_URL)
    exporter = CountingExporter(LeanExporter(_exporter(settings, env), resource, scope), spans_count)
    queue = export_queue(exporter, settings, env)
    parent_based, ratio = sampler_of(settings, env)
    return Tracing(queue, TraceCounts(exporter, queue), settings.capture_content, parent_based, ratio)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("chatgate")
    except PackageNotFoundError:
        return ""


class LeanExporter:
    """Exports chatgate's traces (an ExchangeTrace per request): over OTLP/HTTP encoded by
    chatgate.tracing.lean and sent by the official exporter's HTTP client (its endpoint, headers, compression,
    retries and timeout); to any other exporter as the SDK's ReadableSpans.

    That client is the exporter's `_client` (opentelemetry-exporter-otlp-common's `_OTLPHTTPClient`, whose
    `export` takes the encoded request): not a public API, so pyproject.toml bounds the exporter to the
    minor release it is written for, and a client without that method is not used (the spans then go
    through the exporter's own, slower, encoder)."""

    def __init__(self, inner: Any, resource: Any, scope: Any) -> None:
        self.inner = inner
        self.resource = resource
        self.scope = scope
        self.encoder = Encoder(Head(dict(resource.attributes), scope.name, scope.version or "", SCHEMA_URL))
        self._client = http_client(inner)
        self._stopped = False

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        if self._client is None:
            return self.inner.export(readable(spans, self.resource, self.scope))
        if self._stopped:
            return SpanExportResult.FAILURE
        data = self.encoder.request(spans)
        result = self._client.export(data)
        return SpanExportResult.SUCCESS if result.success else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self._stopped = True
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


def http_client(exporter: Any) -> Any:
    """The OTLP/HTTP exporter's client that sends an encoded request, or None."""
    if not type(exporter).__module__.startswith("opentelemetry.exporter.otlp.proto.http"):
        return None
    client = getattr(exporter, "_client", None)
    if not callable(getattr(client, "export", None)):
        log.warning("this opentelemetry-exporter-otlp-proto-http has no client chatgate can hand an encoded "
                    "request to: spans are encoded by the exporter (slower)")
        return None
    return client


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


def export_queue(exporter: CountingExporter, settings: TracingSettings, env: Mapping[str, str]
                 ) -> ExportQueue[ExchangeTrace]:
    """The queue of traces for the exporter. It holds a request's trace as one item (its SERVER span and a
    CLIENT span per attempt): `tracing.max_queue_size` spans are as many requests of two spans. Batches
    go every OTEL_BSP_SCHEDULE_DELAY milliseconds (5000), or as soon as one is full."""
    traces = max(1, settings.max_queue_size // 2)
    try:
        delay = max(float(env.get("OTEL_BSP_SCHEDULE_DELAY", "") or 5000), 1.0) / 1000
    except ValueError:
        delay = 5.0
    return ExportQueue(exporter, span_count, traces, min(256, traces), delay)
