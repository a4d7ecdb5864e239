"""What the routes share, one per app: settings, store, recorder, metrics and the gateway."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import httpx2

from chatgate.confirmation.service import Confirmations
from chatgate.gateway.auth import Authenticator
from chatgate.gateway.background import Background
from chatgate.gateway.checking import Checkers
from chatgate.gateway.currency import resolve_currency
from chatgate.gateway.endpoints import build_endpoints, families
from chatgate.gateway.family import Family
from chatgate.gateway.ledger import Ledger
from chatgate.gateway.proxy import Endpoint, Gateway
from chatgate.gateway.retry import retrying
from chatgate.gateway.upstream import Upstream
from chatgate.metering.metrics import Metrics
from chatgate.metering.pricing import Pricing
from chatgate.metering.recorder import Recorder, store_tag
from chatgate.quotas.gate import Quotas
from chatgate.refusals.log import RefusalLog
from chatgate.refusals.store import open_refusal_store
from chatgate.repair.memory import TurnMemory
from chatgate.runs.tracker import Runs
from chatgate.settings import Settings
from chatgate.store import Store, open_store
from chatgate.tracing.setup import build_tracing
from chatgate.tracing.spans import Tracing

log = logging.getLogger("chatgate")


class State:
    """What the routes share; one per app."""

    def __init__(self, settings: Settings, transport: httpx2.AsyncBaseTransport | None,
                 store: Store | None, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.clock = clock  # the time requests are recorded and priced at (a test sets it)
        self.pricing: Pricing | None = None
        self.transport = transport
        self.store = store
        self.metrics = Metrics(settings.profiles())
        self.recorder: Recorder | None = None
        self.gateway: Gateway | None = None
        self.models_cache: dict[str, tuple[float, bytes]] = {}  # (expiry, list) by upstream key hash
        self.memory: TurnMemory | None = None
        self.quotas: Quotas | None = None
        self.endpoints: dict[str, Endpoint]  # POST routes forwarded to DeepSeek, by path
        self.dry_runs: dict[str, Endpoint]  # POST /validate routes, by path
        self.endpoints, self.dry_runs = build_endpoints(settings)
        self._prefixed = {e.family.path_prefix: e.family for e in self.endpoints.values()
                          if e.family.path_prefix}
        self._purger: asyncio.Task[None] | None = None
        self.tracing: Tracing | None = None
        self.refusals: RefusalLog | None = None

    @property
    def currency(self) -> str:
        """The currency chatgate prices in (pricing.currency resolved at start)."""
        return self.pricing.currency if self.pricing is not None else "USD"

    def family_for(self, path: str) -> Family | None:
        """The family whose path prefix `path` is under (its error shape for a path chatgate does not
        serve); None: the OpenAI shape."""
        return next((f for prefix, f in self._prefixed.items() if path.startswith(prefix)), None)

    @property
    def gw(self) -> Gateway:
        assert self.gateway is not None, "the app has not started"
        return self.gateway

    async def start(self) -> None:
        s = self.settings
        if self.store is None and s.store.enabled:
            self.store = await asyncio.to_thread(open_store, s.store.url)
        if self.store is not None:
            await asyncio.to_thread(self.store.migrate)
            self.recorder = Recorder(self.store, s.store.spool_dir, s.store.batch_max,
                                     s.store.flush_interval_ms / 1000, s.store.retry_seconds)
            await asyncio.to_thread(self.recorder.start)  # replays what a dead process left, first
            self.metrics.watch_recorder(self.recorder)
        upstream = Upstream(s.upstream, self.transport)
        # Where no other process reads the store before the next round could, the turn cache's ring is a
        # file in the spool directory, the turns' durable copy (chatgate/repair/memory.py); read back on
        # start.
        ring = None
        if self.recorder is not None and not self.recorder.store.server and s.server.workers == 1:
            ring = str(self.recorder.spool_dir / f"turns-{store_tag(self.recorder.store)}.ring")
        self.memory = await asyncio.to_thread(TurnMemory, self.store, s.repair.reasoning_ttl_seconds,
                                              s.repair.reasoning_cache_bytes, ring_path=ring)
        currency = await resolve_currency(s, upstream)
        self.pricing = s.pricing_book(currency)
        self.metrics.tally.currency = currency.lower()
        self.quotas = Quotas(s, self.store, self.clock, currency)
        self.metrics.watch_budgets(self.quotas.budget_gauges)
        await self._observability()
        background = Background()
        auth = Authenticator(s.auth, self.store, on_refused=self.metrics.auth_failure)
        store = self.recorder.store if self.recorder is not None else None
        shared = s.server.workers > 1 or (store is not None and store.server)
        runs = Runs(store, self.quotas.book, s.profiles(), s.limits.cache_seconds, shared=shared,
                    traced=self.tracing is not None) if s.runs.enabled else None
        if runs is not None:
            await runs.start()
        self.gateway = Gateway(
            s, upstream=upstream, auth=auth, retrier=retrying(s, self.metrics, self.quotas.alerts),
            metrics=self.metrics, checkers=Checkers(s, families), memory=self.memory,
            ledger=Ledger(s, self.recorder, self.metrics, self.pricing, self.quotas, background, runs),
            background=background, pricing=self.pricing, quotas=self.quotas, files=self.store,
            tracing=self.tracing, refusals=self.refusals, runs=runs, clock=self.clock,
            confirmations=Confirmations(s.validation, self.store, self.quotas.alerts, self.metrics,
                                        s.upstream.total_timeout, self.clock)
            if self.store is not None and s.validation.confirm_every_s > 0 and s.validation.enabled else None)
        self._purger = asyncio.get_running_loop().create_task(self._purge_expired_turns())

    async def _observability(self) -> None:
        """Tracing (chatgate.tracing) and the refusal inspector (chatgate.refusals), each only when it is
        on."""
        s = self.settings
        self.tracing = build_tracing(s.tracing)
        if self.tracing is not None:
            self.metrics.registry.register(self.tracing.collector())
        if self.store is not None and s.server.capture_refusals > 0:
            refusals = RefusalLog(open_refusal_store(self.store.url), s.server.capture_refusals,
                                  s.server.refusal_ttl_hours, s.server.log_content)
            await asyncio.to_thread(refusals.start)
            self.refusals = refusals

    async def _purge_expired_turns(self) -> None:
        """Relayed reasoning is deleted once it expires (every replica purges; the deletes are idempotent)."""
        assert self.memory is not None
        while True:
            await asyncio.sleep(self.settings.repair.purge_interval_seconds)
            try:
                await self.memory.purge()
                if self.store is not None:
                    await asyncio.to_thread(self.store.purge_holds, time.time())
            except Exception:  # never let the loop die: the next round tries again
                log.exception("purging expired turns or budget holds failed")

    async def stop(self) -> None:
        if self._purger is not None:
            self._purger.cancel()
        if self.gateway is not None:
            await self.gateway.drain()
            await self.gateway.upstream.aclose()
            self.gateway.checkers.close()
        if self.refusals is not None:
            await asyncio.to_thread(self.refusals.stop)
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)
        if self.memory is not None:
            await self.memory.drain()
            self.memory.close()
        if self.quotas is not None:
            await self.quotas.close()
        if self.recorder is not None:
            flushed = await asyncio.to_thread(self.recorder.stop, 30.0)
            if not flushed:
                log.warning("%d usage record(s) left in the spool; they are written on the next start",
                            self.recorder.pending)
        if self.store is not None:
            await asyncio.to_thread(self.store.close)

    def readiness_problems(self) -> list[str]:
        problems = []
        if self.store is not None:
            try:
                self.store.ping()
            except Exception as exc:
                problems.append(f"usage store not writable: {type(exc).__name__}")
        if self.recorder is not None and not self.recorder.healthy:
            problems.append(self.recorder.last_error or "usage writer failing")
        if self.recorder is not None and self.recorder.dropped:
            problems.append(f"the usage store refused {self.recorder.dropped} record(s); they were dropped "
                            "and logged whole (see the log), a restart clears this")
        auth = self.settings.auth
        pool = self.gateway.pool if self.gateway is not None else None
        if auth.mode == "managed" and not self.settings.upstream.accounts and auth.upstream_api_key is None:
            problems.append("auth.mode is managed but DEEPSEEK_API_KEY is not set")
        if pool is not None and self.settings.upstream.accounts:
            problems += [f"upstream account {row['name']}: its key variable {row['key_env']} is not set"
                         for row in pool.states() if row["state"] == "no_key"]
        return problems
