"""The runs of this process: which run each request belongs to (`Runs.enter`, before it is admitted and
forwarded: where a run's bounds refuse it), and what it added to its run (`Runs.add`, with its usage
record). Runs are written to the store in batches, off the request path; a run seen by another replica or
before a restart is found there.

A request's run is the one it names (`x-chatgate-run`, its agent's session: chatgate/runs/identity.py), else
the one whose last request its history continues (chatgate/runs/history.py), else a new one. Only requests
with a history, or offering tools, are read at all; what is forwarded never changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from chatgate.errors import APIError
from chatgate.ids import new_id
from chatgate.profiles import ModelProfile
from chatgate.quotas.book import LimitBook
from chatgate.runs.history import NO_CALLS, Calls, Shape, shape
from chatgate.runs.identity import Headers, declared
from chatgate.runs.summary import RUN_LIMIT, rounds, runs_document, summarize
from chatgate.store.base import LimitRow, StoreError, UsageRecord
from chatgate.store.runs import RunHead, RunStore, requests_of

log = logging.getLogger("chatgate.runs")

MAX_RUNS = 50_000  # live runs remembered by this process (the least recently seen are forgotten)
MAX_PRINTS = 100_000  # history prints remembered
SAME_START = 16  # runs remembered per print: as many as an agent runs at once from the same start
FLUSH_SECONDS = 0.2
QUEUE_MAX = 100_000


class Caller(Protocol):
    @property
    def key_id(self) -> str: ...

    @property
    def key_name(self) -> str: ...

    @property
    def team(self) -> str: ...

    @property
    def caller(self) -> str: ...


class Path(Protocol):
    @property
    def history(self) -> str | None: ...


class Traced(Protocol):
    conversation: str | None


class Repairs(Protocol):
    @property
    def applied(self) -> Sized: ...


class RunRequest(Protocol):
    """What runs read of the gateway's exchange (chatgate/gateway/exchange.py)."""

    @property
    def request_id(self) -> str: ...

    @property
    def identity(self) -> Caller: ...

    @property
    def route(self) -> Path: ...

    @property
    def ts(self) -> float: ...

    @property
    def attempts(self) -> int: ...

    @property
    def repaired(self) -> Repairs | None: ...

    @property
    def trace(self) -> Traced | None: ...

    def json(self) -> dict[str, Any]: ...

    def own_parse(self) -> Any: ...


@dataclass(frozen=True, slots=True)
class Bounds:
    turns: int | None = None
    cost: int | None = None  # pico-units of the prices' currency
    repeats: int | None = None

    @staticmethod
    def of(rows: Sequence[LimitRow | None]) -> Bounds | None:
        def least(values: list[int | None]) -> int | None:  # the tightest of the team's and the key's
            given = [v for v in values if v is not None]
            return min(given) if given else None
        found = [r for r in rows if r is not None]
        turns, cost = least([r.run_max_turns for r in found]), least([r.run_max_cost_picousd for r in found])
        bounds = Bounds(turns, cost, least([r.run_max_repeats for r in found]))
        return None if bounds == Bounds() else bounds


@dataclass(slots=True)
class Live:
    """A run as this process knows it, and what it has not written yet (`out`, the `d_` counters)."""

    head: RunHead
    turns: int = 0  # its requests forwarded (or on their way)
    cost: int = 0
    same: int = 0  # the hash of the last tool calls its model made
    streak: int = 0  # how many times in a row it made them
    own: tuple[int, int] | None = None  # the print of its last request's history
    fresh: bool = False  # it may have requests in the store this process has not counted
    out: list[tuple[Any, ...]] = field(default_factory=list)
    d_requests: int = 0
    d_turns: int = 0
    d_cost: int = 0
    last_seen: float = 0.0


@dataclass(slots=True)
class Entry:
    """A request on its way, as `add` will record it."""

    live: Live
    retry: bool
    calls: Calls
    finish: str | None


def thread_text(p: tuple[int, int]) -> str:
    return f"{p[0]:x}-{p[1]:016x}"


def run_limit(run_id: str, bound: str, limit: str, what: str) -> APIError:
    return APIError(
        429, f"chatgate stopped the agent run {run_id!r}: it reached its bound {bound} = {limit} ({what}). "
        "Nothing was sent to DeepSeek. To go on, start a new run: send another `x-chatgate-run` header value "
        "(or a new session), or start a new conversation instead of continuing this history; or raise the "
        f"bound (chatgate keys set / teams set --{bound.replace('_', '-')}).",
        "run_limit_exceeded", None, RUN_LIMIT, headers={"x-should-retry": "false"})


class Runs:
    def __init__(self, store: RunStore | None, book: LimitBook | None, profiles: Mapping[str, ModelProfile],
                 bounds_seconds: float, shared: bool = False, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.book = book
        self.profiles = profiles
        self.bounds_seconds = bounds_seconds
        self.shared = shared  # replicas share the store: a bounded run's counters are read from it
        self.clock = clock
        # the runs and prints seen last (the first seen are forgotten first: a run forgotten here is found
        # again in the store by its last print)
        self._live: OrderedDict[str, Live] = OrderedDict()
        self._prints: OrderedDict[tuple[int, int], list[Live]] = OrderedDict()
        self._pending: dict[str, Entry] = {}
        self._bounds: dict[tuple[str, str], tuple[float, int, Bounds | None]] = {}
        self._dirty: dict[str, Live] = {}  # the runs with something not written yet
        self._unsaved: list[RunHead] = []  # updates a store error sent back, tried again first
        self._writer: asyncio.Task[None] | None = None

    # --- the request path ------------------------------------------------------------------------------

    async def enter(self, ex: RunRequest, header: Headers, sent: object = None) -> APIError | None:
        """The request's run, found or begun; its refusal when it would go beyond one of the run's bounds.
        `sent`: R1's parse of the body as the client sent it (a repair puts back what the client dropped,
        never a part of the history runs read; and the client's next request holds its own version), so
        that a repaired body is not parsed again. A fault of the runs' own never fails the request: it is
        logged, and the request is in no run."""
        try:
            kind = ex.route.history
            if kind is None:
                return None
            data = sent if type(sent) is dict else ex.own_parse()
            if type(data) is not dict:
                data = ex.json()
            found = self._identify(ex, kind, data, header)
            if found is None:
                return None
            entry, named = found
            if entry is None:
                entry = await self._look_up(ex, named)
            live = entry.live
            if ex.trace is not None:
                ex.trace.conversation = live.head.run_id
            streak = live.streak
            if not entry.retry and entry.calls.names:
                streak = streak + 1 if entry.calls.same == live.same else 1
            bounds = None
            if self.book is not None:
                team, key_id = ex.identity.team, ex.identity.key_id
                cached = self._bounds.get((team, key_id))
                if cached is not None and cached[0] > time.monotonic() and cached[1] == self.book.generation:
                    bounds = cached[2]
                else:
                    bounds = await self._bounds_of(team, key_id)
            if bounds is not None:
                if self.shared or live.fresh:
                    await self._catch_up(live)
                refusal = self._over(live, bounds, streak)
                if refusal is not None:
                    self._pending[ex.request_id] = entry
                    return refusal
            if not entry.retry:
                live.same, live.streak = (entry.calls.same, streak) if entry.calls.names else (0, 0)
            live.turns += 1
            self._pending[ex.request_id] = entry
            return None
        except Exception:
            self._pending.pop(ex.request_id, None)
            log.exception("runs: request %s left out of the runs", ex.request_id)
            return None

    def add(self, ex: RunRequest, record: UsageRecord) -> None:
        """The request's usage, added to its run (written with the run's next update); never raises."""
        try:
            self._add(ex, record)
        except Exception:
            log.exception("runs: request %s not added to its run", ex.request_id)

    def _add(self, ex: RunRequest, record: UsageRecord) -> None:
        entry = self._pending.pop(ex.request_id, None)
        if entry is None:
            if record.outcome != "rejected":
                return
            entry = self._rejected(ex)  # refused by the rules, before `enter`: counted as the run's refusal
            if entry is None:
                return
        live = entry.live
        cost = record.cost_picousd
        live.cost += cost
        if self.store is None:  # metering off: the bounds still count, nothing is kept
            return
        profile = self.profiles.get(record.model)
        window = profile.context_window if profile is not None else 0
        rule = record.rule_code
        live.out.append((
            record.request_id, record.ts, record.model, record.outcome,
            record.upstream_status or (200 if record.outcome == "ok" else 0), rule, record.prompt_tokens,
            record.completion_tokens, record.prompt_cache_hit_tokens, record.prompt_cache_miss_tokens,
            record.reasoning_tokens, cost, record.currency, window,
            record.attempts, len(ex.repaired.applied) if ex.repaired is not None else 0, entry.retry,
            Counter(entry.calls.names) if entry.calls.names and not entry.retry else {}, live.streak,
            entry.finish))
        live.d_requests += 1
        if rule is None or not rule.startswith(RUN_LIMIT):
            live.d_turns += 1
        live.d_cost += cost
        if record.ts > live.last_seen:
            live.last_seen = record.ts
        self._dirty[live.head.run_id] = live
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write_every())

    # --- finding the run ---------------------------------------------------------------------------------

    def _identify(self, ex: RunRequest, kind: str, data: dict[str, Any], header: Headers
                  ) -> tuple[Entry | None, tuple[str, str, Shape | None]] | None:
        """The request's entry when this process knows its run (else None and what to look up), or None
        when the request is in no run."""
        items = data.get("input" if kind == "responses" else "messages")
        named = declared(kind, data, header)
        caller = ex.identity.caller or ex.identity.key_id
        read = shape(kind, items, caller, bool(data.get("tools")) or named is not None) \
            if type(items) is list else None
        if named is not None:
            run_id, source = named
            live = self._live.get(run_id)
            if live is None:
                return None, (run_id, source, read)
            retry = read is not None and live.own == read.own
            if read is not None:
                live.own = read.own
            return self._entry(live, read, retry), (run_id, source, read)
        if read is None:
            return None
        if read.after is not None:
            same = self._prints.get(read.own)
            if same:  # this history again: a retry (an opening again is a new run: agents start alike)
                return self._entry(same[-1], read, True), ("", "inferred", read)
            before = self._prints.get(read.after)
            if before:
                live = before[0] if len(before) == 1 else next(
                    (r for r in before if r.own == read.after), before[-1])
                self._advance(live, read)
                return self._entry(live, read, False), ("", "inferred", read)
            return None, ("", "inferred", read)
        return self._entry(self._begin(ex, new_id(), "inferred", read), read, False), ("", "inferred", read)

    def _entry(self, live: Live, read: Shape | None, retry: bool) -> Entry:
        if read is None:
            return Entry(live, retry, NO_CALLS, None)
        return Entry(live, retry, read.calls, read.finish)

    def _advance(self, live: Live, read: Shape) -> None:
        live.own = read.own
        prints = self._prints
        runs = prints.get(read.own)
        if runs is None:
            prints[read.own] = [live]
        else:  # runs that began alike (one agent started again and again): the latest few
            runs.append(live)
            if len(runs) > SAME_START:
                del runs[0]
        if len(prints) > MAX_PRINTS:
            prints.popitem(last=False)  # (a dict's first key after many deletions is found in O(n))

    def _begin(self, ex: RunRequest, run_id: str, source: str, read: Shape | None) -> Live:
        i = ex.identity
        live = Live(RunHead(run_id, i.key_id, i.key_name, i.team, source, ex.ts))
        self._remember(live)
        if read is not None:
            self._advance(live, read)
        return live

    def _remember(self, live: Live) -> None:
        self._live[live.head.run_id] = live
        if len(self._live) > MAX_RUNS:
            self._live.popitem(last=False)

    async def _look_up(self, ex: RunRequest, named: tuple[str, str, Shape | None]) -> Entry:
        """A run this process does not know: one named (seen by another replica, or before a restart, or
        new), or one whose history continues a print the store may hold."""
        run_id, source, read = named
        if not run_id and read is not None and read.after is not None and self.store is not None:
            stored = None
            with contextlib.suppress(StoreError):
                stored = await asyncio.to_thread(self.store.run_of_thread, thread_text(read.after))
            if stored is not None:
                live = self._live.get(stored.run_id)
                if live is None:
                    h = stored
                    head = RunHead(h.run_id, h.key_id, h.key_name, h.team, h.source, h.started,
                                   stopped=h.stopped)
                    live = Live(head, h.turns, h.cost_picousd, streak=h.streak, fresh=self.shared)
                    self._remember(live)
                self._advance(live, read)
                return self._entry(live, read, False)
        if not run_id:
            return self._entry(self._begin(ex, new_id(), "inferred", read), read, False)
        if run_id in self._live:  # begun meanwhile by another request
            return self._entry(self._live[run_id], read, False)
        live = self._begin(ex, run_id, source, None)
        live.fresh = True
        if read is not None:
            live.own = read.own
        return self._entry(live, read, False)

    def _rejected(self, ex: RunRequest) -> Entry | None:
        kind = ex.route.history
        if kind is None:
            return None
        found = self._identify(ex, kind, ex.json(), ())
        if found is None:
            return None
        entry, named = found
        if entry is not None:
            return entry
        run_id, source, read = named
        return self._entry(self._begin(ex, run_id or new_id(), source, read), read, False)

    # --- the bounds ----------------------------------------------------------------------------------------

    async def _bounds_of(self, team: str, key_id: str) -> Bounds | None:
        book = self.book
        if book is None:
            return None
        now = time.monotonic()
        cached = self._bounds.get((team, key_id))
        if cached is not None and cached[0] > now and cached[1] == book.generation:
            return cached[2]
        try:
            rows = (await book.get("team", team), await book.get("key", key_id))
        except StoreError:
            return None
        bounds = Bounds.of(rows)
        if len(self._bounds) > 10_000:
            self._bounds.clear()
        self._bounds[(team, key_id)] = (now + self.bounds_seconds, book.generation, bounds)
        return bounds

    async def _catch_up(self, live: Live) -> None:
        """A bounded run's counters as the store has them (its requests on other replicas, before a
        restart), with what this process has not written yet and its requests still under way."""
        live.fresh = False
        if self.store is None:
            return
        try:
            stored = await asyncio.to_thread(self.store.run_head, live.head.run_id, False)
        except StoreError:
            return
        if stored is None or stored.run_id != live.head.run_id:
            return
        under_way = sum(1 for e in self._pending.values() if e.live is live)
        live.turns = stored.turns + live.d_turns + under_way
        live.cost = stored.cost_picousd + live.d_cost
        if not live.out:
            live.streak = stored.streak

    def _over(self, live: Live, bounds: Bounds, streak: int) -> APIError | None:
        run_id = live.head.run_id
        refusal = None
        if bounds.turns is not None and live.turns >= bounds.turns:
            refusal = run_limit(run_id, "run_max_turns", str(bounds.turns),
                                f"{live.turns} requests sent in this run")
        elif bounds.cost is not None and live.cost >= bounds.cost:
            refusal = run_limit(run_id, "run_max_cost_usd", str(bounds.cost / 1e12),
                                f"this run has cost {live.cost / 1e12:.6f} so far")
        elif bounds.repeats is not None and streak >= bounds.repeats:
            refusal = run_limit(run_id, "run_max_repeats", str(bounds.repeats),
                                f"the model made the same tool call with the same arguments {streak} "
                                "times in a row")
        if refusal is not None:
            live.head.stopped = refusal.message.split("bound ", 1)[1].split(" ", 1)[0]
        return refusal

    # --- the store ---------------------------------------------------------------------------------------

    async def _write_every(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            await self.flush()

    async def flush(self) -> None:
        """Write each run's update: what it added since the last (kept for the next try when the store is
        down)."""
        if self.store is None or not (self._dirty or self._unsaved):
            return
        dirty, self._dirty = self._dirty, {}
        batch = []
        for live in dirty.values():
            h = live.head
            batch.append((RunHead(h.run_id, h.key_id, h.key_name, h.team, h.source, h.started, live.last_seen,
                                  h.stopped, thread_text(live.own) if live.own is not None else None,
                                  live.d_requests, live.d_turns, live.d_cost, live.streak), live.out))
            live.out, live.d_requests, live.d_turns, live.d_cost = [], 0, 0, 0
        unsaved, self._unsaved = self._unsaved, []
        try:
            await asyncio.to_thread(_save, self.store, unsaved, batch)
        except StoreError as exc:
            log.warning("runs: writing %d runs' updates failed (kept for the next try): %s", len(batch), exc)
            self._unsaved = [*unsaved, *(head for head, _ in batch)][-QUEUE_MAX:]

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            self._writer = None
        await self.flush()

    # --- reading -------------------------------------------------------------------------------------------

    async def document(self, team: str | None = None, key_id: str | None = None, since: float = 0.0,
                       limit: int = 200) -> dict[str, Any]:
        """GET /admin/runs: the runs with a request since `since`, latest begun first."""
        await self.flush()
        if self.store is None:
            return {"object": "list", "runs": []}
        heads = await asyncio.to_thread(self.store.find_runs, team, key_id, since, limit)
        return runs_document(heads)

    async def one(self, run_id: str) -> dict[str, Any] | None:
        """One run with its requests round by round (None: no such run)."""
        await self.flush()
        if self.store is None:
            return None
        return await asyncio.to_thread(show, self.store, run_id)


Batch = list[tuple[RunHead, list[tuple[Any, ...]]]]


def _save(store: RunStore, unsaved: list[RunHead], batch: Batch) -> None:
    """Encode the batch's rounds (here, off the event loop) and write the updates."""
    for head, out in batch:
        head.rounds = b"".join([orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in out]).decode()
    store.save_runs([*unsaved, *(head for head, _ in batch)])


def show(store: RunStore, run_id: str) -> dict[str, Any] | None:
    """`chatgate runs show RUN`'s document: the run's line and its requests (`rounds`)."""
    head = store.run_head(run_id)
    if head is None:
        return None
    requests = requests_of(head)
    return {"run": summarize(head, requests), "rounds": rounds(requests)}
