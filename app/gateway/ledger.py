"""The record of each exchange: one usage record per request, its metrics and its access-log line."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from app.gateway.accesslog import AccessLog, access_line
from app.gateway.exchange import Exchange
from app.ids import new_id
from app.metering.cache import Advisor
from app.metering.metrics import Metrics
from app.metering.pricing import Pricing
from app.metering.recorder import Recorder
from app.metering.tokens import count_async, count_text
from app.metering.usage import TokenCounts
from app.quotas.gate import Quotas
from app.quotas.model import Admission
from app.settings import Settings
from app.store.base import UsageRecord


class Ledger:
    def __init__(self, settings: Settings, recorder: Recorder | None, metrics: Metrics, pricing: Pricing,
                 quotas: Quotas | None = None,
                 spawn: Callable[[Coroutine[Any, Any, None]], None] | None = None) -> None:
        self.settings = settings
        self.pricing = pricing
        self.recorder = recorder
        self.metrics = metrics
        self.quotas = quotas  # an admitted exchange's reservations are settled by its record
        self.spawn = spawn  # runs a settlement that needs I/O (shared counters) off the request
        self.access_log = AccessLog() if settings.server.access_log else None
        c = settings.cache
        self.advisor = Advisor(c.breaks, c.memory_per_caller, c.memory_bytes)

    async def estimate(self, ex: Exchange, prompt_text: Callable[[], str], completion_text: str,
                       reasoning_text: str = "") -> TokenCounts:
        """DeepSeek sent no usage: count locally with its tokenizer, off the event loop
        (app/metering/tokens.py: the interpreter lock released, one count at a time)."""
        def count() -> TokenCounts:
            prompt = count_text(prompt_text())
            reasoning = count_text(reasoning_text)
            completion = count_text(completion_text) + reasoning
            return TokenCounts(prompt, completion, 0, prompt, reasoning)
        return await count_async(count)

    def sketch(self, ex: Exchange) -> None:
        """The cache advisor's parts of the request, taken as it is forwarded, while its body and objects are
        still in the CPU's caches (serialising an agent round's two new messages took ~12 µs in a loaded
        server at the exchange's end, ~7 µs here); the exchange then lets them go (`Exchange.release`)."""
        if self.advisor.memory is not None:
            ex.sketch = self.advisor.sketch(ex.route.upstream_path, ex.identity.caller or ex.identity.key_id,
                                            ex.checked, ex.json, ex.body, ex.own_parse())

    def finish(self, ex: Exchange, outcome: str, status: int, tokens: TokenCounts | None = None, *,
               exact: bool = True, rule_code: str | None = None, upstream_status: int | None = None) -> None:
        """Write the exchange's one usage record (spooled at once), count it and log it."""
        if ex.finished:
            return
        ex.finished = True
        if ex.lease is not None:  # the account's request is over (a stream's: its last event is at hand)
            ex.lease.release()
            ex.lease = None
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
            unpriced=unpriced and tokens.prompt_tokens + tokens.completion_tokens > 0,
            currency=self.pricing.currency,
            attempts=ex.attempts, account=ex.account, cache_saved_picousd=saved,
            cache_break=broke.param if broke is not None else None,
            cache_lost_tokens=broke.lost_tokens if broke is not None else 0, cache_lost_picousd=lost)
        if self.recorder is not None:
            self.recorder.record(record)
        if ex.admission is not None:
            self._settle(ex.admission, record)
        if (trace := ex.trace) is not None:
            capture = trace.tracing.capture_content
            trace.finish(record, status, ex.json() if capture else None,
                         ex.completion_text if capture else None)
        self.metrics.observe(record, status)
        if self.access_log is not None:
            line = access_line(record, status)
            if self.settings.server.log_content:
                line["request_body"] = ex.body.decode("utf-8", "replace")
                line["completion"] = ex.completion_text
            self.access_log.write(line)

    def _settle(self, admission: Admission, record: UsageRecord) -> None:
        """The reservations made at admission give way to what the exchange used (app/quotas/gate.py)."""
        quotas = self.quotas
        assert quotas is not None  # an exchange is admitted only when there are quotas
        tokens = record.prompt_tokens + record.completion_tokens
        if quotas.in_process:
            quotas.settle_now(admission, tokens, record.cost_picousd)
        else:
            assert self.spawn is not None
            self.spawn(quotas.settle(admission, tokens, record.cost_picousd))

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


def _storable(text: str) -> str:
    """A client's text (the model it asked for) as every store can hold it: PostgreSQL's text has no NUL."""
    return text.replace("\x00", "\ufffd") if "\x00" in text else text
