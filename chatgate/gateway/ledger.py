"""The record of each exchange: one usage record per request, its metrics and its access-log line."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from chatgate.gateway.accesslog import AccessLog, access_line
from chatgate.gateway.background import Background
from chatgate.gateway.exchange import Exchange
from chatgate.ids import new_id
from chatgate.metering.cache import Advisor
from chatgate.metering.calls import UNIT_OF, ModelCalls, ToolUnits
from chatgate.metering.metrics import Metrics
from chatgate.metering.pricing import Pricing
from chatgate.metering.recorder import Recorder
from chatgate.metering.tokens import count_async, count_text
from chatgate.metering.usage import TokenCounts
from chatgate.quotas.gate import Quotas
from chatgate.quotas.model import Admission
from chatgate.runs.tracker import Runs
from chatgate.settings import Settings
from chatgate.store.base import UsageRecord


class Ledger:
    def __init__(self, settings: Settings, recorder: Recorder | None, metrics: Metrics, pricing: Pricing,
                 quotas: Quotas | None = None, background: Background | None = None,
                 runs: Runs | None = None) -> None:
        self.settings = settings
        self.pricing = pricing
        self.recorder = recorder
        self.metrics = metrics
        self.quotas = quotas  # an admitted exchange's reservations are settled by its record
        self.background = background  # runs a settlement that needs I/O (shared counters) off the request
        server = settings.server
        self.access_log = AccessLog(log_format=server.log_format) if server.access_log else None
        c = settings.cache
        self.advisor = Advisor(c.breaks, c.memory_per_caller, c.memory_bytes)
        self.runs = runs  # the agent runs each record adds to (chatgate/runs/)

    async def estimate(self, ex: Exchange, prompt_text: Callable[[], str], completion_text: str,
                       reasoning_text: str = "", media: int = 0) -> TokenCounts:
        """DeepSeek sent no usage: count locally with its tokenizer, off the event loop
        (chatgate/metering/tokens.py: the interpreter lock released, one count at a time); `media`: what the
        request's images and documents add (chatgate/gateway/media.py), which its text does not show."""
        exact = self.settings.limits.count_tokens_exact_bytes

        def bounded(text: str) -> int:  # too long to count at once: its UTF-8 bytes (a token is 1 or more)
            return count_text(text) if len(text) <= exact else len(text.encode("utf-8", "replace"))

        def count() -> TokenCounts:
            prompt = bounded(prompt_text()) + media
            reasoning = bounded(reasoning_text)
            completion = bounded(completion_text) + reasoning
            return TokenCounts(prompt, completion, 0, prompt, reasoning)
        return await count_async(count)

    def sketch(self, ex: Exchange) -> None:
        """The cache advisor's parts of the request, taken as it is forwarded, while its body and objects are
        still in the CPU's caches (cheaper here than at the exchange's end); the exchange then lets them go
        (`Exchange.release`)."""
        if self.advisor.memory is not None:
            ex.sketch = self.advisor.sketch(ex.route.prompt, ex.identity.caller or ex.identity.key_id,
                                            ex.checked, ex.json, ex.body, ex.own_parse())

    def finish(self, ex: Exchange, outcome: str, status: int, tokens: TokenCounts | None = None, *,
               exact: bool = True, rule_code: str | None = None, upstream_status: int | None = None,
               units: ToolUnits | None = None, calls: ModelCalls | None = None) -> None:
        """Write the exchange's one usage record (spooled at once), count it and log it. `units`: what a tool
        API's successful call is billed for; `calls`: the web searches and fetches a model made."""
        if ex.finished:
            return
        ex.finished = True
        if ex.tries is not None:  # the account's request is over (a stream's: its last event is at hand)
            ex.tries.release()
        tokens = tokens or TokenCounts()
        rates = self.pricing.rates(ex.priced_as or ex.model, ex.ts)
        unpriced = rates is None
        if rates is None:  # recorded at the catalogue's highest price, never at 0 (limits.unpriced)
            rates = self.pricing.ceiling_rates(ex.ts)
        cost = rates.cost(tokens)
        saved = 0 if unpriced else rates.discount(tokens.prompt_cache_hit_tokens)
        broke = None
        if outcome == "ok" and ex.sketch is not None:  # (every forwarded exchange was sketched)
            broke = self.advisor.settle(ex.identity.caller or ex.identity.key_id, ex.sketch,
                                        tokens.prompt_tokens, tokens.prompt_cache_hit_tokens, ex.request_id)
        lost = 0 if broke is None or unpriced else rates.discount(broke.lost_tokens)
        billed = _billed(self.pricing, ex.tool, outcome, units, calls, ex.ts) \
            if units is not None or calls is not None or ex.route.tool is not None else None
        if billed is not None:
            cost += billed.picousd
        run = ex.run
        if run is None and outcome == "rejected" and self.runs is not None:
            run = self.runs.rejected(ex)  # refused by the rules, before it entered its run
        run_id = thread = detail = None
        if run is not None and self.runs is not None:
            run_id, thread, detail = self.runs.stamp(
                run, ex.identity.key_id, ex.model, len(ex.repaired.applied) if ex.repaired is not None else 0)
            self.runs.add(run, cost)
        record = UsageRecord(
            record_id=new_id(), ts=ex.ts, request_id=ex.request_id, key_id=ex.identity.key_id,
            key_name=ex.identity.key_name, team=ex.identity.team, model=_storable(ex.model),
            route=ex.route.label, stream=ex.stream, outcome=outcome, rule_code=rule_code,
            upstream_status=upstream_status,
            prompt_tokens=tokens.prompt_tokens, completion_tokens=tokens.completion_tokens,
            prompt_cache_hit_tokens=tokens.prompt_cache_hit_tokens,
            prompt_cache_miss_tokens=tokens.prompt_cache_miss_tokens,
            reasoning_tokens=tokens.reasoning_tokens,
            cost_picousd=cost, latency_ms=round(ex.elapsed_ms(), 3),
            ttfb_ms=round(ex.ttfb_ms, 3) if ex.ttfb_ms is not None else None, tokens_exact=exact,
            repairs=",".join(ex.repaired.codes()) if ex.repaired is not None and ex.repaired.applied
            else None,
            unpriced=(unpriced and tokens.prompt_tokens + tokens.completion_tokens > 0)
            or (billed is not None and billed.unknown),
            currency=self.pricing.currency,
            attempts=ex.attempts, account=ex.tries.account if ex.tries is not None else None,
            cache_saved_picousd=saved,
            cache_break=broke.param if broke is not None else None,
            cache_lost_tokens=broke.lost_tokens if broke is not None else 0, cache_lost_picousd=lost,
            run_id=run_id, run_thread=thread, run_detail=detail)
        if billed is not None:
            record = dataclasses.replace(record, **billed.fields())
        if self.recorder is not None:
            self.recorder.record(record)
        if ex.admission is not None:
            self._settle(ex.admission, record)
        if (trace := ex.trace) is not None:
            capture = trace.tracing.capture_content
            trace.finish(record, status, ex.json() if capture else None,
                         ex.completion_text if capture else None)
        self.metrics.observe(record, status)
        if billed is not None:
            for tool, unit, source, n in billed.counts:
                self.metrics.billed_units(tool, unit, source, n)
        if self.access_log is not None:
            line = access_line(record, status)
            if self.settings.server.log_content:
                line["request_body"] = ex.body.decode("utf-8", "replace")
                line["completion"] = ex.completion_text
            self.access_log.write(line)

    def _settle(self, admission: Admission, record: UsageRecord) -> None:
        """The reservations made at admission give way to what the exchange used (chatgate/quotas/gate.py)."""
        quotas = self.quotas
        assert quotas is not None  # an exchange is admitted only when there are quotas
        tokens = record.prompt_tokens + record.completion_tokens
        if quotas.in_process:
            quotas.settle_now(admission, tokens, record.cost_picousd)
        else:
            assert self.background is not None
            self.background.spawn(quotas.settle(admission, tokens, record.cost_picousd))

    def refused(self, route: str, request_id: str, status: int, code: str | None, ts: float) -> None:
        """A request refused before it had an exchange (auth, body size, content type): no usage record."""
        self.note(route, request_id, status, "refused", ts, code=code)

    def note(self, route: str, request_id: str, status: int, outcome: str, ts: float, **fields: Any) -> None:
        """A request that makes no usage record (refused early, or answered by chatgate itself): counted in
        /metrics and access-logged."""
        self.metrics.observe_status(route, status)
        if self.access_log is not None:
            self.access_log.write({"event": "request", "ts": ts, "request_id": request_id, "route": route,
                                   "status": status, "outcome": outcome, **fields})


class _Billed:
    """A record's non-token charges: units, their unit and cost (unknown: `unknown`), and the counts for
    /metrics as (tool, unit, source, units)."""

    __slots__ = ("counts", "estimated", "picousd", "unit", "units", "unknown")

    def __init__(self, units: int, unit: str | None, picousd: int | None, estimated: bool,
                 counts: list[tuple[str, str, str, int]]) -> None:
        self.units, self.unit, self.estimated, self.counts = units, unit, estimated, counts
        self.unknown = picousd is None
        self.picousd = picousd or 0

    def fields(self) -> dict[str, Any]:
        return {"billed_units": self.units, "billed_unit": self.unit, "billed_estimated": self.estimated,
                "billed_picousd": self.picousd}


def _billed(pricing: Pricing, tool: str | None, outcome: str, units: ToolUnits | None,
            calls: ModelCalls | None, ts: float) -> _Billed | None:
    """What a record bills besides tokens (chatgate/metering/calls.py), at the catalogue's per-call prices in
    the deployment's currency: a tool API's units (a successful call only: an error or a timeout is free), or
    the searches and fetches a model made."""
    if tool is not None:
        if units is None or outcome != "ok":
            return None
        unit = UNIT_OF.get(tool)
        if unit is None:  # a successful call of a tool whose unit and price are unknown (ASR)
            return _Billed(0, None, None, False, [])
        return _Billed(units.units, unit, pricing.call_cost(tool, units.units, ts) if units.units else 0,
                       units.estimated, [(tool, unit, "api", units.units)])
    if calls is None or not calls.total:
        return None
    counts = [("search", "call", "model", calls.searches), ("fetch", "call", "model", calls.fetches)]
    searches = pricing.call_cost("search", calls.searches, ts, made_by_model=True)
    fetches = pricing.call_cost("fetch", calls.fetches, ts, made_by_model=True)
    cost = None if searches is None or fetches is None else searches + fetches
    return _Billed(calls.total, "call", cost, calls.estimated, counts)


def _storable(text: str) -> str:
    """A client's text (the model it asked for) as every store can hold it: PostgreSQL's text has no NUL."""
    return text.replace("\x00", "\ufffd") if "\x00" in text else text
