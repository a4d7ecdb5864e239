"""Which currency chatgate prices in (`pricing.currency`): USD, CNY, or "auto", the DeepSeek account's own,
as `/user/balance` says it (`balance_infos[].currency`) when chatgate starts in managed mode."""

from __future__ import annotations

import logging
import time

import orjson

from chatgate.errors import APIError
from chatgate.gateway.accounts import Pool
from chatgate.gateway.upstream import Upstream
from chatgate.metering.catalogue import CURRENCIES
from chatgate.settings import Settings

log = logging.getLogger("chatgate")
BALANCE_PATH = "/user/balance"


async def resolve_currency(settings: Settings, upstream: Upstream) -> str:
    """USD or CNY. "auto" asks DeepSeek in managed mode (the pool's first account with a key); in passthrough
    mode, or when DeepSeek cannot say, it is USD, with a warning."""
    wanted = settings.pricing.currency
    if wanted != "auto":
        return wanted
    pool = Pool.from_settings(settings)
    authorization = next((a.authorization for a in pool.accounts if a.authorization), None) if pool else None
    if authorization is None:
        why = "passthrough mode has no account of its own" if pool is None else "no key to ask DeepSeek with"
        log.warning("pricing.currency = auto: %s; pricing in USD", why)
        return "USD"
    headers = [(b"authorization", authorization), (b"accept-encoding", b"identity")]
    deadline = time.perf_counter() + settings.upstream.connect_timeout + 10
    try:
        resp, body = await upstream.fetch("GET", BALANCE_PATH, headers, deadline)
        currency = _currency(orjson.loads(body)) if resp.status_code == 200 else None
        why = f"HTTP {resp.status_code}" if resp.status_code != 200 else "no known currency in its answer"
    except (APIError, orjson.JSONDecodeError) as exc:
        currency, why = None, str(exc)
    if currency is None:
        log.warning("pricing.currency = auto: DeepSeek's /user/balance did not say the account's currency "
                    "(%s); pricing in USD", why)
        return "USD"
    log.info("pricing.currency = auto: the DeepSeek account holds %s; costs and budgets are in %s",
             currency, currency)
    return currency


def _currency(balance: object) -> str | None:
    infos = balance.get("balance_infos") if isinstance(balance, dict) else None
    if not isinstance(infos, list):
        return None
    found = [i.get("currency") for i in infos if isinstance(i, dict)]
    return next((c for c in found if c in CURRENCIES), None)
