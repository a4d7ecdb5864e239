"""The pool of DeepSeek accounts chatgate sends managed-mode requests with (`[[upstream.accounts]]`).

DeepSeek limits concurrency per account, not per key, so the accounts are separate accounts. Each request
goes to the available account with the fewest requests in flight for its weight. An account that answers
429 is set aside for DeepSeek's Retry-After; without one, while other requests of it are in flight, it takes
no more requests at once than those (DeepSeek's 429 means the account's concurrency is used up: its limit,
learned) for RATE_LIMIT_ASIDE_MAX_S; else it is set aside for a short back-off. One that answers 401 or 402
(a revoked key, no balance) is set aside for `upstream.account_cooldown_s`, and `on_unavailable` is told (the
webhook). A pool of
one account is never set aside for 401/402: there is nowhere else to go, and each request then gets
DeepSeek's own answer (a top-up takes effect at once).

An account may be pinned to teams (`teams = [...]`): a team with accounts of its own is served by those only,
and the other teams by the accounts pinned to none, so that no two of them share an account's context cache
(docs/security.md). A request that names uploaded files goes to the account that holds them, whatever its
team.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from chatgate.gateway.upstream import ReadAnswer
from chatgate.settings import Settings

DEFAULT = "default"  # the one account of a pool made from DEEPSEEK_API_KEY
FILES = "files"  # DEEPSEEK_API_KEY beside a pool it is not part of: requests that name uploaded files
RATE_LIMIT_ASIDE_MAX_S = 5.0  # a 429 without Retry-After: aside at most this long (doubling from the base)


@dataclass(slots=True)
class Account:
    name: str
    key_env: str
    authorization: bytes | None  # b"Bearer sk-…"; None: the variable is not set
    weight: float = 1.0
    in_flight: int = 0
    aside_until: float = 0.0  # time.monotonic()
    why: str | None = None  # why it is set aside (a status), for /readyz and the dashboard
    strikes: int = 0  # 429s in a row
    last_error: tuple[int, list[tuple[bytes, bytes]], bytes] | None = None
    requests: int = 0
    keyless: bool = False  # the implicit account: without DEEPSEEK_API_KEY it goes without a key, as before
    # A 429 with requests of it in flight: DeepSeek's concurrency limit for it, learned, until cap_until
    cap: int = 0
    cap_until: float = 0.0
    teams: frozenset[str] = frozenset()  # the teams it serves alone (empty: the teams pinned to none)

    def available(self, now: float) -> bool:
        return (self.authorization is not None or self.keyless) and self.aside_until <= now \
            and not self.full(now)

    def full(self, now: float) -> bool:
        return self.cap > 0 and self.cap_until > now and self.in_flight >= self.cap


@dataclass(slots=True)
class Lease:
    """An account taken for one attempt: counted in flight until released."""

    pool: Pool
    account: Account
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.account.in_flight -= 1
            self.pool.changed()  # a request of a full account ended: there is room again

    def succeeded(self) -> None:
        self.account.strikes = 0


@dataclass
class Pool:
    accounts: list[Account]
    cooldown_s: float = 300.0
    clock: Callable[[], float] = time.monotonic
    # (account name, status, seconds aside): an account became unavailable (the webhook)
    on_unavailable: Callable[[str, int, float], None] | None = None
    # called when an account's availability may have changed (the metrics gauge reads `states`)
    on_change: Callable[[], None] | None = None
    # The account that holds the Files API's uploads (its key is DEEPSEEK_API_KEY, which the Files routes
    # use): a request naming an uploaded file goes there, whatever its load. None: the first account.
    files: Account | None = None
    _turn: int = field(default=0, repr=False)
    _event: asyncio.Event | None = field(default=None, repr=False)
    _pinned: frozenset[str] = field(default=frozenset(), repr=False)  # the teams some account serves alone
    _unpinned: list[Account] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._pinned = frozenset(t for a in self.accounts for t in a.teams)
        self._unpinned = [a for a in self.accounts if not a.teams]

    @classmethod
    def from_settings(cls, settings: Settings, env: Mapping[str, str] | None = None,
                      on_unavailable: Callable[[str, int, float], None] | None = None) -> Pool | None:
        """The managed-mode pool; None in passthrough mode (the caller's own key goes upstream)."""
        if settings.auth.mode != "managed":
            return None
        env = os.environ if env is None else env
        up = settings.upstream
        key = settings.auth.upstream_api_key
        secret = _bearer(key.get_secret_value() if key else None)
        if not up.accounts:
            return cls([Account(DEFAULT, "DEEPSEEK_API_KEY", secret, keyless=True)], up.account_cooldown_s,
                       on_unavailable=on_unavailable)
        accounts = [Account(a.name, a.key_env, _bearer(env.get(a.key_env)), a.weight,
                            teams=frozenset(a.teams)) for a in up.accounts]
        files = next((a for a in accounts if secret is not None and a.authorization == secret), None)
        if files is None and secret is not None:  # DEEPSEEK_API_KEY is an account of its own, for files only
            files = Account(FILES, "DEEPSEEK_API_KEY", secret)
        return cls(accounts, up.account_cooldown_s, on_unavailable=on_unavailable, files=files)

    def serving(self, team: str | None) -> list[Account]:
        """The accounts that serve `team`: those pinned to it if any, else those pinned to no team."""
        if team is None or not self._pinned:
            return self.accounts
        return [a for a in self.accounts if team in a.teams] if team in self._pinned else self._unpinned

    def acquire(self, files: bool = False, team: str | None = None) -> Lease | None:
        """The available account with the fewest requests in flight for its weight (ties in turn) of those
        that serve `team`; for a request that names uploaded files (`files`), the account that holds them."""
        now = self.clock()
        if files:
            holder = self.files or self.accounts[0]
            if not holder.available(now):
                return None
            holder.in_flight += 1
            holder.requests += 1
            return Lease(self, holder)
        best: Account | None = None
        accounts = self.serving(team)
        n = len(accounts)
        if not n:
            return None
        self._turn = (self._turn + 1) % n
        for i in range(n):
            account = accounts[(self._turn + i) % n]
            if not account.available(now):
                continue
            if best is None or account.in_flight / account.weight < best.in_flight / best.weight:
                best = account
        if best is None:
            return None
        best.in_flight += 1
        best.requests += 1
        if best.why is not None:  # back from being set aside
            best.why = None
            self.changed()
        return Lease(self, best)

    def available_now(self) -> bool:
        now = self.clock()
        return any(a.available(now) for a in self.accounts)

    def awaiting_release(self, team: str | None = None) -> bool:
        """Whether an account set aside comes back as soon as one of its requests ends."""
        now = self.clock()
        return any(a.full(now) for a in self.serving(team))

    def next_free(self, team: str | None = None) -> float:
        """When the first account set aside comes back (clock time); far away if none has a key."""
        now = self.clock()
        keyed = [max(a.aside_until, a.cap_until if a.full(now) else 0.0) for a in self.serving(team)
                 if a.authorization is not None or a.keyless]
        return min(keyed) if keyed else now + 1e9

    def rate_limited(self, account: Account, retry_after: float | None, base_s: float,
                     answer: ReadAnswer) -> None:
        """A 429 (the attempt's lease already released): set aside for Retry-After (capped at the cooldown
        of a 401/402, or RATE_LIMIT_ASIDE_MAX_S if that is lower); else, with requests of
        it in flight, it takes no more than those at once (DeepSeek's concurrency limit, learned) for
        RATE_LIMIT_ASIDE_MAX_S; with none in flight, set aside for a back-off that doubles with each 429."""
        account.strikes += 1
        if retry_after is not None:  # a far HTTP date is no reason for more
            aside = min(retry_after, max(self.cooldown_s, RATE_LIMIT_ASIDE_MAX_S))
            self._set_aside(account, aside, "429", answer)
        elif account.in_flight > 0:
            account.cap, account.cap_until = account.in_flight, self.clock() + RATE_LIMIT_ASIDE_MAX_S
            self._set_aside(account, 0.0, "429", answer)
        else:
            aside = min(max(base_s, 0.05) * 2 ** (account.strikes - 1), RATE_LIMIT_ASIDE_MAX_S)
            self._set_aside(account, aside, "429", answer)

    def unavailable(self, account: Account, status: int, answer: ReadAnswer | None = None) -> None:
        """A 401 (the key is refused) or 402 (no balance): set aside for the cooldown, and say so."""
        if len(self.accounts) > 1:
            self._set_aside(account, self.cooldown_s, str(status), answer)
        if self.on_unavailable is not None:
            self.on_unavailable(account.name, status, self.cooldown_s if len(self.accounts) > 1 else 0.0)

    def _set_aside(self, account: Account, seconds: float, why: str, answer: ReadAnswer | None) -> None:
        account.aside_until = max(account.aside_until, self.clock() + seconds)
        account.why = why
        if answer is not None:
            account.last_error = (answer.status_code, list(answer.raw_headers), answer.content)
        self.changed()

    def others(self, account: Account, team: str | None) -> bool:
        """Whether another account serves `team` (a 401 or 402 of this one can go there)."""
        return any(a is not account for a in self.serving(team))

    def last_error(self, team: str | None = None) -> ReadAnswer | None:
        """DeepSeek's last error from an account set aside, to answer with while all are."""
        errors = [a.last_error for a in self.serving(team) if a.last_error is not None]
        if not errors:
            return None
        status, headers, content = errors[-1]
        return ReadAnswer(status, headers, content)

    def changed(self) -> None:
        if self._event is not None:  # wake the requests waiting for an account
            self._event.set()
            self._event = None
        if self.on_change is not None:
            self.on_change()

    async def wait(self, timeout: float) -> None:
        """Until an account may have come back (a request of the pool ended), at most `timeout` s."""
        if self._event is None:
            self._event = asyncio.Event()
        event = self._event
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await event.wait()

    def states(self) -> list[dict[str, Any]]:
        """Each account's state (never its key), for /readyz, the dashboard and the metrics."""
        now = self.clock()
        out = []
        separate = self.files is not None and all(self.files is not a for a in self.accounts)
        for a in [*self.accounts, *([self.files] if separate and self.files is not None else [])]:
            state = ("no_key" if a.authorization is None and not a.keyless
                     else "available" if a.available(now) else "set_aside")
            row: dict[str, Any] = {"name": a.name, "key_env": a.key_env, "weight": a.weight, "state": state,
                                   "in_flight": a.in_flight, "requests": a.requests}
            if state == "set_aside":
                row["why"] = a.why
                row["back_in_s"] = round(max(a.aside_until, a.cap_until if a.full(now) else 0.0) - now, 3)
            if a.cap and a.cap_until > now:
                row["concurrency_limit"] = a.cap
            out.append(row)
        return out


def _bearer(key: str | None) -> bytes | None:
    return f"Bearer {key}".encode("latin-1", "replace") if key else None
