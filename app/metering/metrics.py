"""Prometheus metrics, one registry per app (no import-time globals)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.store.base import UsageRecord

AUTH_SOURCES = 100  # client addresses that get their own label in chatgate_auth_failures; the rest: "other"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class Metrics:
    """Label children are cached: `labels()` takes a lock and builds a key, a few µs each, per request.

    The model label is the model name only for models with a profile, else "other": clients choose the
    name, and unbounded label values would grow memory without limit.
    """

    def __init__(self, known_models: Iterable[str] = ()) -> None:
        self.registry = CollectorRegistry()
        self.known_models = frozenset(known_models)
        r = self.registry
        self.requests = Counter("chatgate_requests", "Requests by route, status and model",
                                ["route", "status", "model"], registry=r)
        self.rejections = Counter("chatgate_rejections", "Requests rejected locally, by rule code",
                                  ["code"], registry=r)
        self.tokens = Counter("chatgate_tokens", "Tokens by kind, model and team", ["kind", "model", "team"],
                              registry=r)
        self.cost = Counter("chatgate_cost_usd", "Cost in USD by model and team", ["model", "team"],
                            registry=r)
        self.cache_saved = Counter("chatgate_cache_saved_usd", "USD DeepSeek's context cache saved (the hits "
                                   "as misses minus as billed), by model and team", ["model", "team"],
                                   registry=r)
        self.cache_lost = Counter("chatgate_cache_lost_usd", "USD estimated lost to prompt-prefix breaks "
                                  "(docs/cache.md), by model and team", ["model", "team"], registry=r)
        self.cache_breaks = Counter("chatgate_cache_breaks", "Prompt-prefix breaks, by where the prefix "
                                    "first differed (indexes past 0 as [*]) and team", ["param", "team"],
                                    registry=r)
        self.upstream_latency = Histogram("chatgate_upstream_latency_seconds", "Whole upstream exchange",
                                          ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.limited = Counter("chatgate_limited", "Requests refused by a budget, rate or concurrency limit, "
                               "by limit (e.g. rpm:team)", ["limit"], registry=r)
        self.repairs = Counter("chatgate_repairs", "Repairs applied to requests, by repair code", ["code"],
                               registry=r)
        self.notices = Counter("chatgate_notices", "Requests with a problem their caller cannot act on "
                               "(logged once per key and hour), by route and code", ["route", "code"],
                               registry=r)
        self.unpriced = Counter("chatgate_unpriced_requests", "Requests that used tokens of a model "
                                "without a price (metered at cost 0), by model", ["model"], registry=r)
        self.restore_misses = Counter("chatgate_reasoning_restore_misses",
                                      "Turns restore_reasoning could not restore (not relayed to that "
                                      "caller, or expired)", registry=r)
        self.ttfb = Histogram("chatgate_time_to_first_byte_seconds", "Upstream time to first byte",
                              ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.auth_failures = Counter(
            "chatgate_auth_failures", "Requests refused with 401 (a missing, unknown or revoked key), by "
            f"client address (the first {AUTH_SOURCES} seen; later ones as \"other\")",
            ["source"], registry=r)
        self._sources: set[str] = set()
        self.upstream_attempts = Counter("chatgate_upstream_attempts", "Attempts sent to DeepSeek, by "
                                         "account and outcome (a status, connect or timeout)",
                                         ["account", "status"], registry=r)
        self.upstream_retries = Counter("chatgate_upstream_retries", "Attempts retried, by reason (a status, "
                                        "connect, timeout, keepalive_drop)", ["reason"], registry=r)
        self._children: dict[tuple[Any, ...], Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def auth_failure(self, source: str) -> None:
        if source not in self._sources:
            if len(self._sources) >= AUTH_SOURCES:
                source = "other"
            else:
                self._sources.add(source)
        self._child(self.auth_failures, source).inc()

    def model_label(self, model: str) -> str:
        return model if model in self.known_models else "other"

    def observe(self, rec: UsageRecord, status: int) -> None:
        model = self.model_label(rec.model)
        self._child(self.requests, rec.route, str(status), model).inc()
        if rec.repairs:
            for code in rec.repairs.split(","):
                self._child(self.repairs, code).inc()
        if rec.outcome in ("rejected", "limited"):
            if rec.outcome == "rejected":
                self._child(self.rejections, rec.rule_code or "unknown").inc()
            return
        for kind, n in (("prompt", rec.prompt_tokens), ("completion", rec.completion_tokens),
                        ("cache_hit", rec.prompt_cache_hit_tokens),
                        ("cache_miss", rec.prompt_cache_miss_tokens),
                        ("reasoning", rec.reasoning_tokens)):
            if n:
                self._child(self.tokens, kind, model, rec.team).inc(n)
        if rec.cost_picousd:
            self._child(self.cost, model, rec.team).inc(rec.cost_picousd / 1e12)
        elif rec.unpriced:
            self._child(self.unpriced, model).inc()
        if rec.cache_saved_picousd:
            self._child(self.cache_saved, model, rec.team).inc(rec.cache_saved_picousd / 1e12)
        if rec.cache_break is not None:
            self._child(self.cache_breaks, param_label(rec.cache_break), rec.team).inc()
            if rec.cache_lost_picousd:
                self._child(self.cache_lost, model, rec.team).inc(rec.cache_lost_picousd / 1e12)
        self._child(self.upstream_latency, model).observe(rec.latency_ms / 1000)
        if rec.ttfb_ms is not None:
            self._child(self.ttfb, model).observe(rec.ttfb_ms / 1000)

    def watch_recorder(self, recorder: RecorderCounts) -> None:
        self.registry.register(RecorderCollector(recorder))

    def noticed(self, route: str, code: str) -> None:
        self._child(self.notices, route, code).inc()

    def watch_accounts(self, states: Callable[[], list[dict[str, Any]]]) -> None:
        """chatgate_upstream_account_available{account}: 1 while the account takes requests."""
        self.registry.register(_AccountsCollector(states))

    def observe_status(self, route: str, status: int) -> None:
        self._child(self.requests, route, str(status), "").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


_INDEX = re.compile(r"\[(?!0\])\d+\]")


def param_label(param: str) -> str:
    """A break's path as a bounded label: `messages[7]` -> `messages[*]` (`messages[0]` stays: the top)."""
    return _INDEX.sub("[*]", param) if "[" in param else param


class RecorderCounts(Protocol):
    written: int
    dropped: int

    @property
    def pending(self) -> int: ...


class RecorderCollector(Collector):
    """The usage writer's counts, read when /metrics is scraped."""

    def __init__(self, recorder: RecorderCounts) -> None:
        self.recorder = recorder

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("chatgate_usage_records_written", "Usage records the store took",
                                  value=self.recorder.written)
        yield CounterMetricFamily("chatgate_usage_records_dropped",
                                  "Usage records the store refused (logged whole, then dropped)",
                                  value=self.recorder.dropped)
        yield GaugeMetricFamily("chatgate_usage_records_spooled",
                                "Usage records spooled, not yet stored",
                                value=self.recorder.pending)


class _AccountsCollector(Collector):
    def __init__(self, states: Callable[[], list[dict[str, Any]]]) -> None:
        self.states = states

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily("chatgate_upstream_account_available",
                                  "1 while the DeepSeek account takes requests, 0 while it is set aside",
                                  labels=["account"])
        for row in self.states():
            gauge.add_metric([row["name"]], 1.0 if row["state"] == "available" else 0.0)
        yield gauge
