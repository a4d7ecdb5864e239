"""Budget alerts: one webhook when a budget crosses its soft threshold (alerts.soft_percent) and one when it
is spent, per budget and period (every replica asks the store first, so only one sends it), retried with
back-off in the background: a request never waits for an alert."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx2

from chatgate.metering.pricing import to_units
from chatgate.settings import AlertSettings
from chatgate.store.base import AlertStore, StoreError

log = logging.getLogger("chatgate.alerts")


class Alerts:
    def __init__(self, settings: AlertSettings, store: AlertStore | None, currency: str = "USD") -> None:
        self.settings = settings
        self.currency = currency
        self.store = store
        self._marked: set[tuple[str, str, float, str]] = set()  # without a store: this process only
        self.tasks: set[asyncio.Task[None]] = set()
        self.sent = 0
        self.failed = 0

    def check(self, scope: str, subject: str, period: str, period_start: float, spent: int, budget: int
              ) -> None:
        if self.settings.webhook_url is None or budget <= 0:
            return
        if spent >= budget:
            self.fire("hard", scope, subject, period, period_start, spent, budget)
        elif spent * 100 >= budget * self.settings.soft_percent:
            self.fire("soft", scope, subject, period, period_start, spent, budget)

    def due(self, level: str, scope: str, subject: str, period_start: float) -> bool:
        """Whether this process would still send that alert (another replica may have sent it)."""
        key = (scope, subject, period_start, level)
        return self.settings.webhook_url is not None and key not in self._marked

    def fire(self, level: str, scope: str, subject: str, period: str, period_start: float, spent: int,
             budget: int) -> None:
        if not self.due(level, scope, subject, period_start):
            return
        key = (scope, subject, period_start, level)
        self._marked.add(key)
        payload = {"event": "budget_alert", "level": level, scope: subject, "scope": scope,
                   "subject": subject, "period": period, "period_start": period_start,
                   "currency": self.currency, "spent": float(to_units(spent)),
                   "budget": float(to_units(budget)),
                   f"spent_{self.currency.lower()}": float(to_units(spent)),
                   f"budget_{self.currency.lower()}": float(to_units(budget)),
                   "percent": round(100 * spent / budget, 2), "ts": time.time()}
        task = asyncio.get_running_loop().create_task(self._deliver(key, payload))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def account_unavailable(self, account: str, status: int, aside_s: float) -> None:
        """A DeepSeek account of the pool answered 401 (key refused) or 402 (no balance): one webhook per
        account, status and cooldown period (chatgate/gateway/accounts.py)."""
        if self.settings.webhook_url is None:
            return
        now = time.time()
        period = max(aside_s, 60.0)
        key = ("account", account, float(int(now // period) * period), str(status))
        if key in self._marked:
            return
        self._marked.add(key)
        why = "the key was refused" if status == 401 else "insufficient balance" if status == 402 else "error"
        payload = {"event": "account_unavailable", "account": account, "status": status, "reason": why,
                   "aside_seconds": aside_s, "ts": now}
        task = asyncio.get_running_loop().create_task(self._deliver(key, payload))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def rule_disputed(self, rule: str, family: str, model: str, request_id: str, message: str) -> None:
        """DeepSeek accepted a request a rule refused (issue 47, chatgate/confirmation/): one webhook per
        rule, family, model and dispute (every replica asks the store first)."""
        if self.settings.webhook_url is None:
            return
        now = time.time()
        key = ("rule", f"{rule}:{family}:{model}", now, "disputed")
        payload = {"event": "rule_disputed", "rule": rule, "family": family, "model": model,
                   "request_id": request_id, "message": message, "ts": now}
        task = asyncio.get_running_loop().create_task(self._deliver(key, payload))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _deliver(self, key: tuple[str, str, float, str], payload: dict[str, Any]) -> None:
        if self.store is not None:
            try:
                first = await asyncio.to_thread(self.store.mark_alert, *key, time.time())
            except StoreError as exc:
                log.warning("could not record a budget alert (%s); sending it anyway", exc)
                first = True
            if not first:
                return  # another replica sends it
        url = self.settings.webhook_url
        assert url is not None
        delay = 1.0
        for attempt in range(self.settings.retries + 1):
            try:
                async with httpx2.AsyncClient(timeout=self.settings.timeout_seconds) as client:
                    resp = await client.post(url, json=payload)
                if resp.status_code < 300:
                    self.sent += 1
                    return
                why = f"HTTP {resp.status_code}"
            except httpx2.HTTPError as exc:
                why = type(exc).__name__
            log.warning("budget alert webhook failed (%s), attempt %d of %d", why, attempt + 1,
                        self.settings.retries + 1)
            if attempt < self.settings.retries:
                await asyncio.sleep(delay)
                delay *= 2
        self.failed += 1

    async def drain(self, timeout: float = 5.0) -> None:
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=timeout)
