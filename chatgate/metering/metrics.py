"""Prometheus metrics, one registry per app (no import-time globals)."""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from chatgate.metering.calls import TOOLS
from chatgate.store.base import UsageRecord

AUTH_SOURCES = 100  # client addresses that get their own label in chatgate_auth_failures; the rest: "other"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class Labelled:
    """A Prometheus counter with labels, and its children, each made the first time its label values are
    asked for and kept: prometheus_client's `labels()` takes a lock and builds a key, a few µs a call."""

    __slots__ = ("_children", "counter")

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
                 ) -> None:
        self.counter = Counter(name, documentation, labelnames, registry=registry)
        self._children: dict[tuple[str, ...], Counter] = {}

    def labels(self, *values: str) -> Counter:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.counter.labels(*values)
        return child


class Metrics:
    """The model label is the model name only for models with a profile, else "other": clients choose the
    name, and unbounded label values would grow memory without limit.
    """

    def __init__(self, known_models: Iterable[str] = ()) -> None:
        self.registry = CollectorRegistry()
        self.known_models = frozenset(known_models) | frozenset(TOOLS)  # a tool API's records: its name
        r = self.registry
        # The counters every request moves are plain dicts, turned into metric families when /metrics is
        # scraped (_Tally): prometheus_client's children take a lock and a check per inc, ~11 a request.
        self.tally = _Tally()
        r.register(self.tally)
        self.cache_lost = Labelled("chatgate_cache_lost_usd", "USD estimated lost to prompt-prefix breaks "
                                   "(docs/cache.md), by model and team", ["model", "team"], registry=r)
        self.cache_lost_cny = Labelled("chatgate_cache_lost_cny", "CNY estimated lost to prompt-prefix "
                                       "breaks (docs/cache.md), by model and team", ["model", "team"],
                                       registry=r)
        self.cache_breaks = Labelled("chatgate_cache_breaks", "Prompt-prefix breaks, by where the prefix "
                                     "first differed (indexes past 0 as [*]) and team", ["param", "team"],
                                     registry=r)
        self.rejections = Labelled("chatgate_rejections", "Requests rejected locally, by rule code",
                                   ["code"], registry=r)
        self.limited = Labelled("chatgate_limited", "Requests refused by a budget, rate or concurrency "
                                "limit, by limit (e.g. rpm:team)", ["limit"], registry=r)
        self.repairs = Labelled("chatgate_repairs", "Repairs applied to requests, by repair code", ["code"],
                                registry=r)
        self.notices = Labelled("chatgate_notices", "Requests with a problem their caller cannot act on "
                                "(logged once per key and hour), by route and code", ["route", "code"],
                                registry=r)
        self.unpriced = Labelled("chatgate_unpriced_requests", "Requests that used tokens of a model "
                                 "without a price (metered at the catalogue's highest price), by model",
                                 ["model"], registry=r)
        self.billed = Labelled("chatgate_billed_calls", "Billed units of DeepSeek's tools (docs/metering.md"
                               "#tool-calls), by tool (search, fetch: calls, the model's own included; ocr: "
                               "pages; tts: characters), unit and source (api: the tool route; model: the "
                               "server web tools of a chat, Messages or Responses answer)",
                               ["tool", "unit", "source"], registry=r)
        self.restore_misses = Counter("chatgate_reasoning_restore_misses",
                                      "Turns restore_reasoning could not restore (not relayed to that "
                                      "caller, or expired)", registry=r)
        self.rule_evidence = Labelled("chatgate_rule_evidence", "What DeepSeek answered the requests "
                                      "chatgate forwarded to confirm a rule or with its warning "
                                      "(docs/confirmation.md), by rule, family and event (confirmed, "
                                      "disputed, refused, accepted)",
                                      ["rule", "family", "event"], registry=r)
        self.unpredicted = Labelled("chatgate_unpredicted_refusals", "DeepSeek's refusals of forwarded "
                                    "requests that no rule of chatgate predicted, by family", ["family"],
                                    registry=r)
        self.auth_failures = Labelled(
            "chatgate_auth_failures", "Requests refused with 401 (a missing, unknown or revoked key), by "
            f"client address (the first {AUTH_SOURCES} seen; later ones as \"other\")",
            ["source"], registry=r)
        self._sources: set[str] = set()
        self.upstream_attempts = Labelled("chatgate_upstream_attempts", "Attempts sent to DeepSeek, by "
                                          "account and outcome (a status, connect or timeout)",
                                          ["account", "status"], registry=r)
        self.upstream_retries = Labelled("chatgate_upstream_retries", "Attempts retried, by reason (a "
                                         "status, connect, timeout, keepalive_drop)", ["reason"], registry=r)

    def auth_failure(self, source: str) -> None:
        if source not in self._sources:
            if len(self._sources) >= AUTH_SOURCES:
                source = "other"
            else:
                self._sources.add(source)
        self.auth_failures.labels(source).inc()

    def model_label(self, model: str) -> str:
        return model if model in self.known_models else "other"

    def observe(self, rec: UsageRecord, status: int) -> None:
        model = self.model_label(rec.model)
        tally = self.tally
        key = (rec.route, status, model)
        requests = tally.requests
        requests[key] = requests.get(key, 0) + 1
        if rec.repairs:
            for code in rec.repairs.split(","):
                self.repairs.labels(code).inc()
        if rec.outcome in ("rejected", "limited"):
            if rec.outcome == "rejected":
                self.rejections.labels(rec.rule_code or "unknown").inc()
            return
        group = (model, rec.team)
        usage = tally.usage.get(group)
        if usage is None:
            usage = tally.usage[group] = [0.0] * len(USAGE_FIELDS)
        usage[0] += rec.prompt_tokens
        usage[1] += rec.completion_tokens
        usage[2] += rec.prompt_cache_hit_tokens
        usage[3] += rec.prompt_cache_miss_tokens
        usage[4] += rec.reasoning_tokens
        if rec.cost_picousd:
            usage[5] += rec.cost_picousd / 1e12
        if rec.unpriced:
            self.unpriced.labels(model).inc()
        if rec.cache_saved_picousd:
            usage[6] += rec.cache_saved_picousd / 1e12
        if rec.cache_break is not None:
            self.cache_breaks.labels(param_label(rec.cache_break), rec.team).inc()
            if rec.cache_lost_picousd:
                lost = self.cache_lost_cny if rec.currency == "CNY" else self.cache_lost
                lost.labels(model, rec.team).inc(rec.cache_lost_picousd / 1e12)
        tally.observe(tally.latency, model, rec.latency_ms / 1000)
        if rec.ttfb_ms is not None:
            tally.observe(tally.ttfb, model, rec.ttfb_ms / 1000)

    def billed_units(self, tool: str, unit: str, source: str, units: int) -> None:
        if units:
            self.billed.labels(tool, unit, source).inc(units)

    def watch_recorder(self, recorder: RecorderCounts) -> None:
        self.registry.register(RecorderCollector(recorder))

    def noticed(self, route: str, code: str) -> None:
        self.notices.labels(route, code).inc()

    def watch_accounts(self, states: Callable[[], list[dict[str, Any]]]) -> None:
        """chatgate_upstream_account_available{account}: 1 while the account takes requests."""
        self.registry.register(_AccountsCollector(states))

    def watch_budgets(self, budgets: Callable[[], Iterable[BudgetState]]) -> None:
        """chatgate_budget_limit, chatgate_budget_spent and chatgate_budget_held, read at each scrape."""
        self.registry.register(_BudgetsCollector(budgets))

    def observe_status(self, route: str, status: int) -> None:
        key = (route, status, "")
        requests = self.tally.requests
        requests[key] = requests.get(key, 0) + 1

    def render(self) -> bytes:
        return generate_latest(self.registry)


# (kind label of chatgate_tokens, or None for the money columns), in the order of a _Tally.usage row
USAGE_FIELDS = ("prompt", "completion", "cache_hit", "cache_miss", "reasoning", None, None)


class _Tally(Collector):
    """chatgate_requests, chatgate_tokens, chatgate_cost_usd, chatgate_cache_saved_usd and the two latency
    histograms, kept as dicts of numbers. Everything runs on the event loop's thread; a scrape reads
    copies."""

    def __init__(self) -> None:
        self.currency = "usd"  # of the costs counted: chatgate_cost_usd or chatgate_cost_cny
        self.requests: dict[tuple[str, int, str], int] = {}
        self.usage: dict[tuple[str, str], list[float]] = {}  # (model, team) -> USAGE_FIELDS + cost, saved
        # model -> counts per bucket (LATENCY_BUCKETS, then +Inf), then the sum
        self.latency: dict[str, list[float]] = {}
        self.ttfb: dict[str, list[float]] = {}

    @staticmethod
    def observe(histogram: dict[str, list[float]], model: str, seconds: float) -> None:
        row = histogram.get(model)
        if row is None:
            row = histogram[model] = [0.0] * (len(LATENCY_BUCKETS) + 2)
        row[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        row[-1] += seconds

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily("chatgate_requests", "Requests by route, status and model",
                                       labels=["route", "status", "model"])
        for (route, status, model), n in list(self.requests.items()):
            requests.add_metric([route, str(status), model], n)
        yield requests
        tokens = CounterMetricFamily("chatgate_tokens", "Tokens by kind, model and team",
                                     labels=["kind", "model", "team"])
        cur = self.currency
        cost = CounterMetricFamily(f"chatgate_cost_{cur}", f"Cost in {cur.upper()} by model and team",
                                   labels=["model", "team"])
        saved = CounterMetricFamily(f"chatgate_cache_saved_{cur}", f"{cur.upper()} DeepSeek's context cache "
                                    "saved (the hits as misses minus as billed), by model and team",
                                    labels=["model", "team"])
        for (model, team), row in list(self.usage.items()):
            for kind, amount in zip(USAGE_FIELDS, row, strict=True):
                if kind is not None and amount:
                    tokens.add_metric([kind, model, team], amount)
            if row[5]:
                cost.add_metric([model, team], row[5])
            if row[6]:
                saved.add_metric([model, team], row[6])
        yield from (tokens, cost, saved)
        yield self._histogram("chatgate_upstream_latency_seconds", "Whole upstream exchange", self.latency)
        yield self._histogram("chatgate_time_to_first_byte_seconds", "Upstream time to first byte", self.ttfb)

    @staticmethod
    def _histogram(name: str, documentation: str, rows: dict[str, list[float]]) -> Metric:
        family = HistogramMetricFamily(name, documentation, labels=["model"])
        bounds = [*(str(float(b)) for b in LATENCY_BUCKETS), "+Inf"]
        for model, row in list(rows.items()):
            running, buckets = 0.0, []
            for bound, count in zip(bounds, row[:-1], strict=True):
                running += count
                buckets.append((bound, running))
            family.add_metric([model], buckets, row[-1])
        return family


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


class BudgetState(Protocol):
    """A budget as /metrics shows it (chatgate.quotas.gate.BudgetGauge); amounts in pico-units of
    `currency`."""

    @property
    def scope(self) -> str: ...
    @property
    def subject(self) -> str: ...
    @property
    def period(self) -> str: ...
    @property
    def currency(self) -> str: ...
    @property
    def limit(self) -> int: ...
    @property
    def spent(self) -> int | None: ...
    @property
    def held(self) -> int | None: ...


BUDGET_LABELS = ["scope", "subject", "period", "currency"]


class _BudgetsCollector(Collector):
    """One series per budget this process knows (a team or key with a budget that sent it a request since
    it started; at most the limit book's 10,000 rows), in units of the budget's currency."""

    def __init__(self, budgets: Callable[[], Iterable[BudgetState]]) -> None:
        self.budgets = budgets

    def collect(self) -> Iterator[Metric]:
        limit = GaugeMetricFamily("chatgate_budget_limit", "The budget of a team or key for its period, in "
                                  "units of its currency (docs/keys-and-limits.md)", labels=BUDGET_LABELS)
        spent = GaugeMetricFamily("chatgate_budget_spent", "Spent in the budget's current period, in units "
                                  "of its currency, as this process knows it (with a shared store: the "
                                  "store's ledger at its last renewal plus what it settled since)",
                                  labels=BUDGET_LABELS)
        held = GaugeMetricFamily("chatgate_budget_held", "Reserved against the budget's current period by "
                                 "this process's requests in flight, in units of its currency",
                                 labels=BUDGET_LABELS)
        for b in self.budgets():
            labels = [b.scope, b.subject, b.period, b.currency]
            limit.add_metric(labels, b.limit / 1e12)
            if b.spent is not None:
                spent.add_metric(labels, b.spent / 1e12)
            if b.held is not None:
                held.add_metric(labels, b.held / 1e12)
        yield from (limit, spent, held)
