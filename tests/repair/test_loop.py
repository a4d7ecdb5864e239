"""The repair loop's recall of relayed turns (chatgate/repair/loop.py), without a server: a turn is put back
only when every call of it is one relayed answer's, with the same tool names, for the same caller; else the
reason, which the 400 then names."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from chatgate.metering.metrics import Metrics
from chatgate.repair.base import RepairOptions
from chatgate.repair.loop import Repairer, _duration
from chatgate.store.base import TurnRow


@dataclass
class Caller:
    caller: str = "key-1"


@dataclass
class Ex:
    identity: Caller = field(default_factory=Caller)


class Memory:
    def __init__(self, rows: list[TurnRow]) -> None:
        self.rows = {r.call_id: r for r in rows}

    async def recall(self, caller: str, kind: str, call_ids: Sequence[str]) -> dict[str, TurnRow]:
        return {i: self.rows[i] for i in call_ids if i in self.rows and self.rows[i].caller == caller}


def row(call_id: str, turn: str, names: str = "get_weather,get_time", caller: str = "key-1") -> TurnRow:
    return TurnRow(caller, "chat", call_id, turn, names, f"reasoning of {turn}", 2e9)


def recall(rows: list[TurnRow], wanted: dict[int, Any], caller: str = "key-1"
           ) -> tuple[dict[int, str], dict[str, str]]:
    repairer = Repairer(None, Memory(rows), RepairOptions(), 3600.0, Metrics({}))  # type: ignore[arg-type]
    return asyncio.run(repairer._recall(Ex(Caller(caller)), "chat", wanted))  # type: ignore[arg-type]


CALLS = (("call_1", "call_2"), ("get_weather", "get_time"))


def test_a_turn_relayed_whole_is_recalled() -> None:
    assert recall([row("call_1", "t1"), row("call_2", "t1")], {3: CALLS}) == ({3: "reasoning of t1"}, {})


def test_calls_of_two_answers_or_other_tool_names_are_not_that_turn() -> None:
    recalled, misses = recall([row("call_1", "t1"), row("call_2", "t2")], {3: CALLS})
    assert recalled == {} and misses == {
        "call_1,call_2": "the tool calls differ from the answer chatgate relayed with these ids"}
    recalled, misses = recall([row("call_1", "t1", "other,names"), row("call_2", "t1", "other,names")],
                              {3: CALLS})
    assert recalled == {} and "differ" in misses["call_1,call_2"]


def test_a_turn_not_relayed_to_this_caller_names_the_ttl() -> None:
    recalled, misses = recall([row("call_1", "t1", caller="key-2"), row("call_2", "t1", caller="key-2")],
                              {3: CALLS})
    assert recalled == {} and misses["call_1,call_2"].endswith("for 1 h)")


def test_a_caller_without_a_key_gets_nothing_back() -> None:
    recalled, misses = recall([row("call_1", "t1"), row("call_2", "t1")], {3: CALLS}, caller="")
    assert recalled == {}
    assert misses == {"call_1,call_2": "chatgate restores turns only for callers that send a key"}


def test_durations_read_as_people_say_them() -> None:
    assert [_duration(s) for s in (7200, 600, 90, 0.5)] == ["2 h", "10 min", "90 s", "0.5 s"]
