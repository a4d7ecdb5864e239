"""Prometheus metrics, one registry per app (no import-time globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from app.pricing import picousd_to_usd
from app.store.base import UsageRecord

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("chatgate_requests", "Requests by route, status and model",
                                ["route", "status", "model"], registry=r)
        self.rejections = Counter("chatgate_rejections", "Requests rejected locally, by rule code",
                                  ["code"], registry=r)
        self.tokens = Counter("chatgate_tokens", "Tokens by kind, model and team", ["kind", "model", "team"],
                              registry=r)
        self.cost = Counter("chatgate_cost_usd", "Cost in USD by model and team", ["model", "team"],
                            registry=r)
        self.upstream_latency = Histogram("chatgate_upstream_latency_seconds", "Whole upstream exchange",
                                          ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttfb = Histogram("chatgate_time_to_first_byte_seconds", "Upstream time to first byte",
                              ["model"], buckets=LATENCY_BUCKETS, registry=r)

    def observe(self, rec: UsageRecord, status: int) -> None:
        self.requests.labels(rec.route, str(status), rec.model).inc()
        if rec.outcome == "rejected":
            self.rejections.labels(rec.rule_code or "unknown").inc()
            return
        for kind, n in (("prompt", rec.prompt_tokens), ("completion", rec.completion_tokens),
                        ("cache_hit", rec.prompt_cache_hit_tokens),
                        ("cache_miss", rec.prompt_cache_miss_tokens),
                        ("reasoning", rec.reasoning_tokens)):
            if n:
                self.tokens.labels(kind, rec.model, rec.team).inc(n)
        if rec.cost_picousd:
            self.cost.labels(rec.model, rec.team).inc(float(picousd_to_usd(rec.cost_picousd)))
        self.upstream_latency.labels(rec.model).observe(rec.latency_ms / 1000)
        if rec.ttfb_ms is not None:
            self.ttfb.labels(rec.model).observe(rec.ttfb_ms / 1000)

    def observe_status(self, route: str, status: int) -> None:
        self.requests.labels(route, str(status), "").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
