"""The repair-and-recall loop: a request's problems fixed by the family's enabled repairs, with the turns the
restore repairs want recalled from the memory of relayed turns, and the body checked again, up to
REPAIR_PASSES times; and the 400 for what is left, saying which turns could not be restored and why.

The gateway (chatgate/gateway/proxy.py) runs it between the check and the forward; the family's repairs
themselves are in each family's package (chatgate/openai/repairs.py, …).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

import orjson

from chatgate.errors import APIError, Problem
from chatgate.metering.metrics import Metrics
from chatgate.profiles import ModelProfile
from chatgate.repair.base import Applied, InPlace, Repaired, RepairOptions, TurnCalls
from chatgate.repair.memory import TurnMemory
from chatgate.store.base import TurnRow
from chatgate.verdict import Rules, Verdict

REPAIR_PASSES = 3  # fixing a type can reveal a sequence problem (the sequence rules need the types right)


class Repairable(Rules, Protocol):
    """What the loop asks of an API family (chatgate/gateway/family.py: the rest of what a family
    provides)."""

    turn_kind: str  # the kind of turn it remembers (TurnMemory)
    restore_codes: frozenset[str]  # problem codes a remembered turn can fix
    restore_repair: str | None  # the repair that uses remembered turns (they are remembered while it is on)

    def repairable(self, found: Sequence[Problem], options: RepairOptions) -> bool: ...

    def turns_to_restore(self, data: dict[str, Any], found: Sequence[Problem], options: RepairOptions
                         ) -> dict[int, tuple[tuple[str, ...], tuple[str, ...]]]:
        """For each message a restore repair would fix: (call ids, tool names) of its turn."""

    def restore_in_place(self, body: bytes, verdict: Verdict, options: RepairOptions) -> InPlace | None:
        """The common case of a restore (every problem is one, nothing else to repair), done on the body's
        bytes, when the family can say for certain where each piece goes; None: parse, repair and dump."""

    def turn_of(self, data: dict[str, Any], problem: Problem) -> tuple[str, ...] | None:
        """The call ids of the turn a restore problem is about (to say why it was not restored)."""

    def repair(self, data: dict[str, Any], found: Sequence[Problem], options: RepairOptions,
               profile: ModelProfile | None, recalled: dict[int, str]) -> list[Applied]: ...


class Rechecker(Protocol):
    """Checks a repaired body again (chatgate/gateway/checking.py: on the loop, or in a checker process)."""

    async def recheck(self, family: Rules, body: bytes, beta: bool, origin: str | None) -> Verdict: ...


class Caller(Protocol):
    @property
    def caller(self) -> str | None: ...


class Beta(Protocol):
    @property
    def beta(self) -> bool: ...


class RepairedRequest(Protocol):
    """The request as the loop sees it (chatgate/gateway/exchange.py)."""

    body: bytes
    repaired: Repaired | None

    @property
    def identity(self) -> Caller: ...

    @property
    def route(self) -> Beta: ...

    def json(self) -> dict[str, Any]: ...

    def replace_body(self, body: bytes, data: dict[str, Any] | None) -> None: ...

    def describe(self, verdict: Verdict) -> None: ...


class Repairer:
    def __init__(self, checkers: Rechecker, memory: TurnMemory, options: RepairOptions, ttl_seconds: float,
                 metrics: Metrics) -> None:
        self.checkers = checkers
        self.memory = memory
        self.options = options
        self.ttl_seconds = ttl_seconds  # how long relayed turns are remembered (for the reason of a miss)
        self.metrics = metrics

    def remembers(self, family: Repairable, verdict: Verdict | None, caller: str | None) -> bool:
        """Whether the answer's tool-call turn is worth remembering for the family's restore repair."""
        return (family.restore_repair is not None and self.options.on(family.restore_repair)
                and verdict is not None and verdict.thinking and verdict.tools
                and bool(caller))

    async def repair(self, ex: RepairedRequest, family: Repairable, verdict: Verdict, origin: str) -> Verdict:
        """Apply the enabled repairs that fix some of the problems found and check the result again, up to
        REPAIR_PASSES times. The common case, turns whose reasoning a client dropped and chatgate relayed,
        is done on the body's bytes when the family can (no parse, no dump, no check again)."""
        in_place = family.restore_in_place(ex.body, verdict, self.options)
        if in_place is not None:
            recalled, missed = await self._recall(ex, family.turn_kind, in_place.wanted)
            if not missed and len(recalled) == len(in_place.wanted):
                # Every problem was a turn's missing reasoning, put back as relayed: nothing else changed,
                # so checking the body again could only find what it found before, minus those.
                body, done = in_place.apply(recalled)
                ex.replace_body(body, None)
                ex.repaired = Repaired(done, {})
                return verdict.without_problems()
        applied: list[Applied] = []
        misses: dict[str, str] = {}
        for _ in range(REPAIR_PASSES):
            found = [*verdict.problems, *verdict.warnings]
            if not family.repairable(found, self.options):
                break
            try:
                data = orjson.loads(ex.body)  # a fresh copy to change
            except orjson.JSONDecodeError:
                break
            if not isinstance(data, dict):
                break
            recalled, missed = await self._recall(ex, family.turn_kind,
                                                  family.turns_to_restore(data, found, self.options))
            misses.update(missed)
            done = family.repair(data, found, self.options, verdict.profile, recalled)
            if not done:
                break
            applied += done
            body = orjson.dumps(data)
            ex.replace_body(body, data)
            if _only_restored(family, verdict, done, len(recalled), missed):
                # Each problem was a turn's missing reasoning, put back as relayed: nothing else changed,
                # so checking the whole body again could only find what it found before, minus those.
                verdict = verdict.without_problems()
                break
            verdict = await self.checkers.recheck(family, body, ex.route.beta, origin)
        if misses:
            self.metrics.restore_misses.inc(len(misses))
        if applied or misses:
            ex.repaired = Repaired(applied, misses)
        if applied:
            ex.describe(verdict)
        return verdict

    async def _recall(self, ex: RepairedRequest, kind: str, wanted: dict[int, TurnCalls]
                      ) -> tuple[dict[int, str], dict[str, str]]:
        """A restore repair's look-up of the turns it wants (message index -> (call ids, tool names)): the
        remembered turn of each, if it is this caller's and its tool calls are the ones chatgate relayed;
        else why not (by call ids)."""
        if not wanted:
            return {}, {}
        if not ex.identity.caller:
            why = "chatgate restores turns only for callers that send a key"
            return {}, {",".join(ids): why for ids, _ in wanted.values()}
        all_ids = [call_id for ids, _ in wanted.values() for call_id in ids]
        rows = await self.memory.recall(ex.identity.caller, kind, all_ids)
        recalled: dict[int, str] = {}
        misses: dict[str, str] = {}
        for i, (ids, names) in wanted.items():
            payload = _payload(rows, ids, names)
            if payload is not None:
                recalled[i] = payload
                continue
            ttl = _duration(self.ttl_seconds)
            misses[",".join(ids)] = (
                "the tool calls differ from the answer chatgate relayed with these ids"
                if any(call_id in rows for call_id in ids) else
                "it has no record of this turn for your key (it restores only what it relayed to the same "
                f"key, for {ttl})")
        return recalled, misses


def refusal(ex: RepairedRequest, family: Repairable, verdict: Verdict) -> APIError:
    """The 400 for what is left, saying which turns could not be restored and why."""
    problems = verdict.problems
    repaired = ex.repaired
    if repaired is not None and repaired.notes:
        data = ex.json()
        problems = [_with_miss(family, data, p, repaired.notes) for p in problems]
    error = APIError.from_problems(problems)
    if repaired is not None and repaired.applied:
        error.repairs = [a.as_dict() for a in repaired.applied]
    return error


def _with_miss(family: Repairable, data: dict[str, Any], problem: Problem, notes: dict[str, str]) -> Problem:
    ids = family.turn_of(data, problem) if problem.code in family.restore_codes else None
    why = notes.get(",".join(ids)) if ids is not None else None
    if why is None:
        return problem
    return dataclasses.replace(problem, message=f"{problem.message} chatgate could not restore it: "
                                                f"{why}.")


def _duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)} min"
    return f"{seconds:g} s"


def _payload(rows: dict[str, TurnRow], ids: tuple[str, ...], names: tuple[str, ...]) -> str | None:
    """The remembered payload of the turn with these calls, if `rows` has every call of one relayed turn,
    with these tool names."""
    got = [rows.get(call_id) for call_id in ids]
    first = got[0] if got else None
    if first is not None and all(r is not None and r.turn == first.turn for r in got) \
            and first.names == ",".join(names):
        return first.payload
    return None


def _only_restored(family: Repairable, verdict: Verdict, done: list[Applied], recalled: int,
                   missed: dict[str, str]) -> bool:
    """Whether the repairs just applied were restores alone, each of what chatgate relayed, one for each
    problem (all of them restore problems): the repaired body is then valid but for the warnings it had."""
    return (not missed and len(done) == len(verdict.problems) == recalled > 0
            and all(a.code == family.restore_repair for a in done)
            and all(p.code in family.restore_codes for p in verdict.problems))
