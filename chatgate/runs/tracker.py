"""A request's part in its agent run, read before it is admitted and forwarded (`Runs.mark`, `Runs.enter`),
and what its usage record keeps of it (`Runs.stamp`). What is forwarded never changes.

Most requests are only read (`Runs.mark`): the run they name (`x-chatgate-run`, their agent's session:
chatgate/runs/identity.py), else their history's link to the request they continue
(chatgate/runs/history.py), goes into their usage record as a `Mark`, and runs are put together from the
records when they are read (chatgate/runs/assemble.py). Nothing is kept in memory for them.

The runs of keys and teams with run bounds, and every run while tracing is on (a trace carries its run's id),
are followed here instead, as they go (`Runs.enter`, `Round`, `Live`): a request's run is the one it names,
else the one whose last request its history continues, else a new one; its id goes into its usage record,
and a bound refuses the request that would go beyond it (`run_limit`). A followed run seen by another
replica or before a restart is found in the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from chatgate.errors import APIError
from chatgate.ids import ordered_id
from chatgate.profiles import ModelProfile
from chatgate.quotas.book import LimitBook
from chatgate.runs.history import Link, Print, answered_link, calls_hash, link, no_history
from chatgate.runs.identity import Headers, declared, names_a_run
from chatgate.store.base import LimitRow, StoreError
from chatgate.store.runs import RUN_LIMIT, RunStore, detail

log = logging.getLogger("chatgate.runs")
_dumps = orjson.dumps

MAX_RUNS = 50_000  # followed runs remembered by this process (the least recently seen are forgotten)
MAX_PRINTS = 2 * MAX_RUNS  # history prints remembered
SAME_START = 16  # runs remembered per print: as many as an agent runs at once from the same start
MAX_BOUNDS = 10_000  # (team, key) pairs whose run bounds are remembered
RECALL_SECONDS = 86_400.0  # on start, the runs of the last day's requests are remembered (at most MAX_RUNS)


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


class RunRequest(Protocol):
    """What runs read of the gateway's exchange (chatgate/gateway/exchange.py)."""

    @property
    def request_id(self) -> str: ...

    @property
    def identity(self) -> Caller: ...

    @property
    def route(self) -> Path: ...

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


Key = tuple[str, Print]  # (key id, a print of its request's history: chatgate/runs/history.py)


@dataclass(slots=True)
class Live:
    """A followed run as this process knows it."""

    run_id: str
    source: str  # how it was told apart: header, session, inferred
    turns: int = 0  # its requests forwarded (or on their way)
    cost: int = 0  # pico-units of the prices' currency
    same: int = 0  # the hash of the last tool calls its model made
    streak: int = 0  # how many times in a row it made them
    own: Key | None = None  # the print of its last request's history
    fresh: bool = False  # it may have requests in the store this process has not counted


@dataclass(slots=True)
class Round:
    """A request's part in a followed run, from `enter` to its usage record."""

    live: Live
    retry: bool  # the history its run's request before it sent, sent again
    read: Link | None  # its history's link
    same: int  # one hash of the tool calls it carries back, with their arguments
    streak: int = 0  # the same tool call in a row, as of this request
    stopped: str | None = None  # the bound that refused it


class Follow(enum.Enum):
    FOLLOW = "follow"  # the request's run may be followed: `Runs.enter` tells


Mark = tuple[str | None, str, "Link | None"]
"""A request's part in a run that is not followed: the run id it names (None: none) and how (header, session,
inferred), and its history's link; a plain tuple, made for every request read."""

Unknown = tuple[str, str, "Link | None", int]  # a run this process does not know: its id ("": none), source,
# the request's link and tool calls' hash


def thread_text(p: Key) -> str:
    """A print as `run_thread` holds it."""
    return f"{p[0]} {p[1][0]}:{p[1][1]}"


def run_limit(run_id: str, bound: str, limit: str, what: str) -> APIError:
    return APIError(
        429, f"chatgate stopped the agent run {run_id!r}: it reached its bound {bound} = {limit} ({what}). "
        "Nothing was sent to DeepSeek. To go on, start a new run: send another `x-chatgate-run` header value "
        "(or a new session), or start a new conversation instead of continuing this history; or raise the "
        f"bound (chatgate keys set / teams set --{bound.replace('_', '-')}).",
        "run_limit_exceeded", None, RUN_LIMIT, headers={"x-should-retry": "false"})


class Runs:
    def __init__(self, store: RunStore | None, book: LimitBook | None, profiles: Mapping[str, ModelProfile],
                 bounds_seconds: float, shared: bool = False, traced: bool = False) -> None:
        self.store = store
        self.book = book
        self.profiles = profiles
        self.bounds_seconds = bounds_seconds
        self.shared = shared  # replicas share the store: a bounded run's counters are read from it
        self.traced = traced  # every run is followed (its id goes into the request's trace)
        # the runs and prints seen last (the first seen are forgotten first: a run forgotten here is found
        # again in the store by its last print)
        self._live: OrderedDict[str, Live] = OrderedDict()
        self._prints: OrderedDict[Key, list[Live]] = OrderedDict()
        self._bounds: OrderedDict[tuple[str, str], tuple[float, int, Bounds | None]] = OrderedDict()
        self._windows = {model: p.context_window for model, p in profiles.items()}

    async def start(self) -> None:
        """Remember the followed runs the store's recent requests were in, as of their latest request (after
        a restart, their next requests go on in them)."""
        if self.store is None:
            return
        try:
            heads = await asyncio.to_thread(self.store.recent_runs, time.time() - RECALL_SECONDS, MAX_RUNS)
        except StoreError as exc:
            log.warning("runs: the recent runs could not be read (%s); their next requests begin new runs",
                        exc)
            return
        for head in reversed(heads):  # the latest last: the first forgotten are the oldest
            live = Live(head.run_id, head.source, streak=head.streak, fresh=True)
            self._remember(live)
            if head.thread is not None:
                self._advance(live, (head.key_id, head.thread))

    # --- the request path ------------------------------------------------------------------------------

    def mark(self, ex: RunRequest, header: Headers, sent: object = None,
             answers: Sequence[tuple[int, Any]] | None = None) -> Mark | Follow | None:
        """The request's `Mark` (None: it is in no run), read in a few steps, or FOLLOW where its run may be
        followed (its key's bounds are not at hand, or it has some, or tracing is on): `enter` then tells.
        `sent`: R1's parse of the body as the client sent it (a repair puts back what the client dropped,
        never a part of the history runs read; and the client's next request holds its own version), so
        that a repaired body is not parsed again; `answers`: the assistant messages of a chat history, as
        its rules found them (`Verdict.answers`). A fault of the runs' own never fails the request: it is
        logged, and the request is in no run."""
        kind = ex.route.history
        if kind is None:
            return None
        try:
            data = sent if type(sent) is dict else _data(ex)
            named = names_a_run(header)
            if kind == "chat" and not named and (not answers if answers is not None else no_history(data)) \
                    and not data.get("tools"):
                return None  # a plain chat's request: nothing more to read
            if self.traced or self._at_hand(ex.identity) is not None:
                return Follow.FOLLOW
            if kind == "chat" and not named and answers is not None and type(items := data.get("messages")) \
                    is list:
                read = answered_link(items, answers, bool(data.get("tools")))
                return None if read is None else (None, "inferred", read)
            return _mark(kind, data, header)
        except Exception:
            log.exception("runs: request %s left out of the runs", ex.request_id)
            return None

    async def enter(self, ex: RunRequest, header: Headers, sent: object = None
                    ) -> tuple[Round | Mark | None, APIError | None]:
        """The request's part in its run (None: it is in no run): its `Mark`, or its `Round` in a followed
        run, with its refusal when it would go beyond one of the run's bounds (`mark` tells most requests'
        part in fewer steps). A fault of the runs' own never fails the request."""
        kind = ex.route.history
        if kind is None:
            return None, None
        try:
            data = sent if type(sent) is dict else _data(ex)
            if kind == "chat" and no_history(data) and not names_a_run(header):
                return None, None
            bounds = self._at_hand(ex.identity)
            if bounds is Follow.FOLLOW:
                assert self.book is not None  # (none: no bounds, at hand)
                bounds = await self._bounds_of(self.book, ex.identity.team, ex.identity.key_id)
            if bounds is None and not self.traced:
                return _mark(kind, data, header), None
            found = self._identify(ex, kind, data, header)
            if found is None:
                return None, None
            run = await self._look_up(ex, found) if isinstance(found, tuple) else found
            live = run.live
            if (trace := ex.trace) is not None:
                trace.conversation = live.run_id
            names = run.read[2] if run.read is not None else None
            if names and not run.retry:
                run.streak = live.streak + 1 if run.same == live.same else 1
            else:
                run.streak = live.streak
            if bounds is not None:
                if self.shared or live.fresh:
                    await self._catch_up(live)
                refusal = self._over(live, bounds, run.streak)
                if refusal is not None:
                    run.stopped = refusal.message.split("bound ", 1)[1].split(" ", 1)[0]
                    return run, refusal
            if not run.retry:
                if names:
                    live.same, live.streak = run.same, run.streak
                else:
                    live.same = live.streak = 0
            live.turns += 1
            return run, None
        except Exception:
            log.exception("runs: request %s left out of the runs", ex.request_id)
            return None, None

    def rejected(self, ex: RunRequest) -> Round | Mark | None:
        """The run of a request the rules refused before `enter`: counted as the run's refusal (None: in no
        run; never raises)."""
        try:
            kind = ex.route.history
            if kind is None:
                return None
            data = ex.json()
            identity = ex.identity
            cached = self._bounds.get((identity.team, identity.key_id))
            if not self.traced and (cached is None or cached[2] is None):
                return _mark(kind, data, ())
            found = self._identify(ex, kind, data, ())
            if not isinstance(found, tuple):
                return found
            run_id, source, read, same = found
            own = None if read is None else (identity.key_id, read[1])
            return Round(self._begin(run_id or ordered_id(), source, own), False, read, same)
        except Exception:
            log.exception("runs: refused request %s left out of the runs", ex.request_id)
            return None

    def stamp(self, run: Round | Mark, key_id: str, model: str, repairs: int
              ) -> tuple[str | None, str | None, str]:
        """What the request's usage record holds of its run: the run's id (None: it is inferred when read),
        the print of the request's history where replicas look a followed run up, and its part in the run
        (chatgate/store/runs.py's `run_id`, `run_thread`, `run_detail`); `repairs`: how many repairs
        chatgate applied to it."""
        window = self._windows.get(model, 0)
        if type(run) is tuple:
            run_id, source, read = run
            if read is None:
                return run_id, None, detail(source, False, None, 0, window, None, None, repairs)
            return run_id, None, _dumps((source, False, read[2], 0, window, None, read[:2],
                                         repairs)).decode()  # (`detail`, in one step)
        assert isinstance(run, Round)
        live, read = run.live, run.read
        if read is None:
            return live.run_id, None, detail(live.source, run.retry, None, run.streak, window, run.stopped,
                                             None, repairs)
        return live.run_id, thread_text((key_id, read[1])) if self.shared else None, detail(
            live.source, run.retry, read[2], run.streak, window, run.stopped, read[:2], repairs)

    @staticmethod
    def add(run: Round | Mark, cost: int) -> None:
        """What the request cost, added to its followed run's (the bound on a run's cost)."""
        if type(run) is Round:
            run.live.cost += cost

    # --- finding a followed run ----------------------------------------------------------------------------

    def _identify(self, ex: RunRequest, kind: str, data: dict[str, Any], header: Headers
                  ) -> Round | Unknown | None:
        """The request's round when this process knows its run, else what to look up; None when the
        request is in no run."""
        items = data.get("input" if kind == "responses" else "messages")
        named = declared(kind, data, header)
        key = ex.identity.key_id
        if named is None:
            if type(items) is not list:
                return None
            read = link(kind, items, bool(data.get("tools")))
            if read is None:
                return None
            after, own, names = read
            same = calls_hash(kind, items) if names else 0
            if after is None:  # an opening: a new run (agents start alike)
                return Round(self._begin(ordered_id(), "inferred", (key, own)), False, read, same)
            prints = self._prints
            again = prints.get((key, own))
            if again:  # this history again: a retry
                return Round(again[-1], True, read, same)
            before = prints.get((key, after))
            if not before:
                return "", "inferred", read, same
            live = before[-1]
            if live.own != (key, after):  # of the runs that began alike, the latest still at that point
                live = next((r for r in reversed(before) if r.own == (key, after)), live)
            self._advance(live, (key, own))
            return Round(live, False, read, same)
        run_id, source = named
        if type(items) is not list:
            return (run_id, source, None, 0) if run_id not in self._live else Round(self._live[run_id], False,
                                                                                    None, 0)
        read = link(kind, items, True)
        same = calls_hash(kind, items) if read is not None and read[2] else 0
        known = self._live.get(run_id)
        if known is None:
            return run_id, source, read, same
        if read is None:
            return Round(known, False, None, 0)
        mine = (key, read[1])
        retry = known.own == mine
        known.own = mine
        return Round(known, retry, read, same)

    def _advance(self, live: Live, own: Key) -> None:
        live.own = own
        prints = self._prints
        runs = prints.get(own)
        if runs is None:
            prints[own] = [live]
            if len(prints) > MAX_PRINTS:
                prints.popitem(last=False)
        else:  # runs that began alike (one agent started again and again): the latest few
            runs.append(live)
            if len(runs) > SAME_START:
                del runs[0]

    def _begin(self, run_id: str, source: str, own: Key | None) -> Live:
        """A new run, remembered, at the print of its first request's history (None: none was read)."""
        live = Live(run_id, source)
        self._remember(live)
        if own is not None:
            self._advance(live, own)
        return live

    def _remember(self, live: Live) -> None:
        self._live[live.run_id] = live
        if len(self._live) > MAX_RUNS:
            self._live.popitem(last=False)

    async def _look_up(self, ex: RunRequest, named: Unknown) -> Round:
        """A run this process does not know: one named (seen by another replica, or before a restart, or
        new), or one whose history continues a print the store may hold."""
        run_id, source, read, same = named
        key = ex.identity.key_id
        own = None if read is None else (key, read[1])
        store = self.store if self.shared else None  # (a process alone remembers every print it stored)
        if not run_id and read is not None and read[0] is not None and store is not None:
            stored = None
            with contextlib.suppress(StoreError):
                stored = await asyncio.to_thread(store.run_of_thread, thread_text((key, read[0])))
            if stored is not None:
                live = self._live.get(stored.run_id)
                if live is None:
                    live = Live(stored.run_id, stored.source, stored.turns, stored.cost_picousd,
                                streak=stored.streak, fresh=self.shared)
                    self._remember(live)
                assert own is not None
                self._advance(live, own)
                return Round(live, False, read, same)
        if not run_id:
            return Round(self._begin(ordered_id(), "inferred", own), False, read, same)
        known = self._live.get(run_id)  # begun meanwhile by another request
        if known is None:
            known = Live(run_id, source, fresh=True, own=own)
            self._remember(known)
        return Round(known, False, read, same)

    # --- the bounds ----------------------------------------------------------------------------------------

    def _at_hand(self, identity: Caller) -> Bounds | Follow | None:
        """The run bounds of the caller's team and key as cached (None: none), or FOLLOW when they are not at
        hand (never looked up, expired, or a limit row changed since)."""
        book = self.book
        if book is None:
            return None
        cached = self._bounds.get((identity.team, identity.key_id))
        if cached is None or cached[0] <= time.monotonic() or cached[1] != book.generation:
            return Follow.FOLLOW
        return cached[2]

    async def _bounds_of(self, book: LimitBook, team: str, key_id: str) -> Bounds | None:
        """The run bounds of a team and key, looked up (`_at_hand` has the ones cached)."""
        now = time.monotonic()
        try:
            rows = (await book.get("team", team), await book.get("key", key_id))
        except StoreError:
            return None
        bounds = Bounds.of(rows)
        self._bounds[(team, key_id)] = (now + self.bounds_seconds, book.generation, bounds)
        if len(self._bounds) > MAX_BOUNDS:
            self._bounds.popitem(last=False)
        return bounds

    async def _catch_up(self, live: Live) -> None:
        """A bounded run's counters as the store has them (its requests on other replicas, before a
        restart). The store lags behind by the records the usage writer has not written yet (a batch's
        worth, milliseconds): this process's own count stands where it is ahead."""
        live.fresh = False
        if self.store is None:
            return
        try:
            stored = await asyncio.to_thread(self.store.run_head, live.run_id)
        except StoreError:
            return
        if stored is None or stored.run_id != live.run_id:
            return
        live.turns = max(live.turns, stored.turns)
        live.cost = max(live.cost, stored.cost_picousd)
        if stored.streak > live.streak:
            live.streak = stored.streak

    def _over(self, live: Live, bounds: Bounds, streak: int) -> APIError | None:
        run_id = live.run_id
        if bounds.turns is not None and live.turns >= bounds.turns:
            return run_limit(run_id, "run_max_turns", str(bounds.turns),
                             f"{live.turns} requests sent in this run")
        if bounds.cost is not None and live.cost >= bounds.cost:
            return run_limit(run_id, "run_max_cost_usd", str(bounds.cost / 1e12),
                             f"this run has cost {live.cost / 1e12:.6f} so far")
        if bounds.repeats is not None and streak >= bounds.repeats:
            return run_limit(run_id, "run_max_repeats", str(bounds.repeats),
                             "the model made the same tool call with the same arguments "
                             f"{streak} times in a row")
        return None


def _data(ex: RunRequest) -> Any:
    data = ex.own_parse()
    return data if type(data) is dict else ex.json()


def _mark(kind: str, data: dict[str, Any], header: Headers) -> Mark | None:
    """A request's `Mark` (None: it is in no run)."""
    items = data.get("input" if kind == "responses" else "messages")
    named = None if kind == "chat" and not names_a_run(header) else declared(kind, data, header)
    if named is None:
        if type(items) is not list:
            return None
        read = link(kind, items, bool(data.get("tools")))
        return None if read is None else (None, "inferred", read)
    return named[0], named[1], link(kind, items, True) if type(items) is list else None
