"""Rules that keep themselves true (issue 47, docs/confirmation.md): a request refused only by claims about
DeepSeek that DeepSeek has not confirmed within `validation.confirm_every_s` is forwarded (one at a time per
rule, family and model across replicas: a lease in the store), and what DeepSeek answers is kept as evidence:
a 4xx confirms the refusal, a 2xx disputes the rule (it warns from then on, for that family and model). Every
4xx DeepSeek gives a forwarded request is credited to a warned rule in its words or grouped as unpredicted.

The gateway asks `decide` only for a request it would refuse, and `answered` only for a request that was
watched (forwarded to confirm, or with a rule's warning) or that DeepSeek refused: a valid request never
reaches this module."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import os
import socket
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from chatgate.confirmation.claims import (
    Claim,
    claims_of,
    credited,
    error_message,
    masked,
    named_only,
    warned_claims,
)
from chatgate.errors import Problem
from chatgate.ids import new_id
from chatgate.metering.metrics import Metrics
from chatgate.quotas.alerts import Alerts
from chatgate.rules.catalogue import lookup
from chatgate.settings import ValidationSettings
from chatgate.store.base import EvidenceEvent, EvidenceStore, RuleEvidence, StoreError

log = logging.getLogger("chatgate.confirmation")
LEASE_MARGIN_S = 30.0  # a confirmation's lease outlives its request's deadline by this much
SCORES_EVERY_S = 5.0  # a replica writes the warned rules' scores of accepted requests at most this often


@dataclass(slots=True)
class Watch:
    """What a forwarded request's answer is evidence about: the claims it was forwarded to confirm (their
    leases held by `holder`), and those it was forwarded with as warnings (disputed or warned rules)."""

    pending: list[Claim] = field(default_factory=list)
    warned: list[Claim] = field(default_factory=list)
    holder: str = ""
    done: bool = False

    @property
    def confirming(self) -> bool:
        return bool(self.pending)


class Confirmations:
    def __init__(self, settings: ValidationSettings, store: EvidenceStore, alerts: Alerts | None,
                 metrics: Metrics, lease_s: float, clock: Callable[[], float] = time.time) -> None:
        self.period = settings.confirm_every_s
        self.promote_after = settings.promote_after
        self.store = store
        self.alerts = alerts
        self.metrics = metrics
        self.lease_s = lease_s + LEASE_MARGIN_S
        self.clock = clock
        self.replica = f"{socket.gethostname()}:{os.getpid()}"
        self._scores: dict[tuple[Claim, str], int] = {}  # (claim, warned|accepted) -> count not yet written
        self._scored_at = 0.0  # monotonic time of the last write of the scores
        self._writing = asyncio.Lock()

    # --- before forwarding --------------------------------------------------------------

    async def decide(self, problems: Sequence[Problem], model: str) -> Watch | None:
        """A refused request: the Watch it is forwarded with, or None to refuse it as always (a problem that
        is not a claim, a claim DeepSeek confirmed within the period, another replica confirming it now, or
        the store unreachable)."""
        claims = claims_of(problems, model)
        if not claims or (rows := await self._evidence(claims)) is None:
            return None  # (the store unreachable: refused as always)
        now = self.clock()
        watch = Watch(holder=f"{self.replica}:{new_id()}")
        for claim in claims:
            row = rows.get(claim.key)
            if row is not None and row.status == "disputed":
                watch.warned.append(claim)
            elif row is not None and row.last_confirmed is not None and \
                    now - row.last_confirmed < self.period:
                return None  # confirmed within the period: refused at once
            else:
                watch.pending.append(claim)
        for i, claim in enumerate(watch.pending):
            try:
                taken = await asyncio.to_thread(self.store.take_rule_lease, claim.key, watch.holder, now,
                                                now + self.lease_s)
            except StoreError as exc:
                log.warning("the confirmation lease could not be taken (%s); refusing as always", exc)
                taken = False
            if not taken:  # another request (of any replica) is confirming it: refused at once
                await self._release(watch.pending[:i], watch.holder)
                return None
        if watch.pending and await self._confirmed_meanwhile(watch.pending, now):
            await self._release(watch.pending, watch.holder)
            return None
        return watch

    async def _confirmed_meanwhile(self, claims: Sequence[Claim], now: float) -> bool:
        """Whether a confirmation that held the lease before this one was kept between the first read and
        the lease (then this one would be a second confirmation within the period)."""
        try:
            rows = await asyncio.to_thread(self.store.rule_evidence, [c.key for c in claims])
        except StoreError:
            return True
        return any(r.last_confirmed is not None and now - r.last_confirmed < self.period for r in rows)

    async def disputed(self, problems: Sequence[Problem], model: str) -> bool:
        """Whether DeepSeek disputed every rule that refuses these problems (it accepted a body each
        refused): what the dry run tells as warnings, as a forwarded request is told (False: one of them is
        not a claim, or is not disputed, or the store is unreachable)."""
        claims = claims_of(problems, model)
        if not claims or (rows := await self._evidence(claims)) is None:
            return False
        return all((row := rows.get(c.key)) is not None and row.status == "disputed" for c in claims)

    async def _evidence(self, claims: Sequence[Claim]) -> dict[tuple[str, str, str], RuleEvidence] | None:
        """The store's evidence of these claims, by their key (None: the store is unreachable, logged)."""
        try:
            rows = await asyncio.to_thread(self.store.rule_evidence, [c.key for c in claims])
        except StoreError as exc:
            log.warning("the rules' evidence could not be read (%s)", exc)
            return None
        return {r.key: r for r in rows}

    async def promoted(self, warnings: Sequence[Problem], model: str) -> list[Problem]:
        """The warnings of warned rules DeepSeek refused `promote_after` times and never accepted
        (`validation.promote_after`), as problems: enforced from now on."""
        if self.promote_after <= 0:
            return []
        claims = {c.key: c for c in warned_claims(warnings, model)}
        if not claims:
            return []
        try:
            rows = await asyncio.to_thread(self.store.rule_evidence, list(claims))
        except StoreError:
            return []
        enforced = {(r.family, r.rule) for r in rows if r.status == "enforced"}
        return [dataclasses.replace(w, warning=False) for w in warnings
                if (e := lookup(w.rule or "")) is not None and (e.family, e.id) in enforced and not w.notice]

    def watch_warnings(self, warnings: Sequence[Problem], model: str, watch: Watch | None) -> Watch | None:
        """The request's Watch with the claims its warnings make added (their scores: warned, then refused
        or accepted)."""
        claims = warned_claims(warnings, model)
        if not claims:
            return watch
        watch = watch or Watch()
        watch.warned.extend(c for c in claims if c not in watch.warned and c not in watch.pending)
        return watch

    # --- DeepSeek's answer --------------------------------------------------------------

    def score(self, watch: Watch, status: int) -> Coroutine[Any, Any, None] | None:
        """A warned request DeepSeek answered without a refusal (2xx, or no answer): its rules' scores,
        added up in memory; the write of them all when one is due (to run in the background), else None."""
        watch.done = True
        for claim in watch.warned:
            self._add(claim, "warned")
            if status < 300:
                self._add(claim, "accepted")
        if time.monotonic() - self._scored_at < SCORES_EVERY_S:
            return None
        self._scored_at = time.monotonic()
        return self.flush()

    def _add(self, claim: Claim, event: str) -> None:
        self._scores[(claim, event)] = self._scores.get((claim, event), 0) + 1

    async def flush(self) -> None:
        """Write the scores added up since the last write (after the write in flight, if any: a report
        that flushes first sees them all)."""
        async with self._writing:
            scores, self._scores = self._scores, {}
            if not scores:
                return
            events = [dataclasses.replace(self._event(claim, event, ""), count=n)
                      for (claim, event), n in sorted(scores.items())]
            try:
                await asyncio.to_thread(self.store.record_evidence, events, self.clock())
            except StoreError as exc:
                log.warning("the warned rules' scores were not kept (%s)", exc)

    async def answered(self, watch: Watch | None, status: int, content: bytes | None, family: str, model: str,
                       request_id: str) -> list[Claim]:
        """Keep what DeepSeek's answer says; the claims it confirmed (for a confirming request's 4xx: then
        the client gets chatgate's own error). Never raises: evidence lost is logged."""
        if watch is not None and watch.done:
            return []
        if watch is not None:
            watch.done = True
        confirmed: list[Claim] = []
        try:
            events: list[EvidenceEvent] = []
            unpredicted: str | None = None
            pending = watch.pending if watch is not None else []
            warned = watch.warned if watch is not None else []
            events += [self._event(c, "warned", request_id) for c in warned]
            if status < 300:
                events += [self._event(c, "disputed", request_id) for c in pending]
                events += [self._event(c, "accepted", request_id) for c in warned]
            elif 400 <= status < 500 and status not in (401, 402, 403, 429):
                message = error_message(content or b"")
                confirmed = credited(pending, message)
                refused = named_only(warned, message)
                events += [self._event(c, "confirmed", request_id) for c in confirmed]
                events += [self._event(c, "refused", request_id) for c in refused]
                if not refused and not named_only(pending, message):  # no rule of it says so
                    unpredicted = masked(message)
            if events:
                await asyncio.to_thread(self.store.record_evidence, events, self.clock())
            for e in events:
                if e.event != "warned":
                    self.metrics.rule_evidence.labels(e.rule, e.family, e.event).inc()
            for claim in pending if status < 300 else []:
                log.warning("DeepSeek accepted a request chatgate's rule %s refused (%s, %s): the rule warns "
                            "from now on (docs/confirmation.md)", claim.rule, claim.family, claim.model)
                if self.alerts is not None:
                    self.alerts.rule_disputed(claim.rule, claim.family, claim.model, request_id,
                                              f"DeepSeek accepted a request chatgate's rule {claim.rule} "
                                              "refused; it warns instead from now on")
            if unpredicted is not None:
                await asyncio.to_thread(self.store.record_unpredicted, family, model, unpredicted,
                                        request_id, self.clock())
                self.metrics.unpredicted.labels(family).inc()
        except StoreError as exc:
            log.warning("the rules' evidence of request %s was not kept (%s)", request_id, exc)
        finally:
            if watch is not None and watch.pending:
                await self._release(watch.pending, watch.holder)
        return confirmed

    def _event(self, claim: Claim, event: str, request_id: str) -> EvidenceEvent:
        entry = lookup(claim.rule)
        status = "warned" if entry is not None and entry.level == "warned" else "enforced"
        return EvidenceEvent(claim.rule, claim.family, claim.model, event, status, request_id,
                             self.promote_after)

    async def _release(self, claims: Sequence[Claim], holder: str) -> None:
        for claim in claims:
            try:
                await asyncio.to_thread(self.store.release_rule_lease, claim.key, holder)
            except StoreError as exc:  # it expires by itself
                log.warning("a confirmation lease was not released (%s)", exc)


# --- the report (`chatgate rules`, GET /admin/rules) ---------------------------------------


def _iso(ts: float | None) -> str | None:
    return None if ts is None else dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds")


def rules_report(store: EvidenceStore, family: str | None = None, since: float | None = None,
                 limit: int = 100) -> dict[str, Any]:
    """Every rule with evidence, and DeepSeek's unpredicted refusals, the most frequent first."""
    rules = []
    for row in store.rule_evidence(None, since):
        if family is not None and row.family != family:
            continue
        rules.append(rule_row(row))
    groups = [{"family": g.family, "model": g.model, "message": g.message, "count": g.count,
               "first_seen": _iso(g.first_seen), "last_seen": _iso(g.last_seen),
               "example_request_ids": list(g.example_request_ids)}
              for g in store.unpredicted(since, limit) if family is None or g.family == family]
    return {"rules": rules, "unpredicted": groups}


def rule_row(row: RuleEvidence) -> dict[str, Any]:
    entry = lookup(row.rule)
    return {"rule": row.rule, "family": row.family, "model": row.model,
            "certainty": entry.certainty if entry is not None else None, "status": row.status,
            "confirmed": row.confirmed, "disputed": row.disputed, "warned": row.warned,
            "refused": row.refused, "accepted": row.accepted,
            "last_confirmed": _iso(row.last_confirmed), "last_disputed": _iso(row.last_disputed),
            "example_request_id": row.example_request_id}
