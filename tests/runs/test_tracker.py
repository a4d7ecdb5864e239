"""`Runs.enter` in process, on the exchange's protocol (chatgate/runs/tracker.py): a plain chat is in no run
unless it names one; an unfollowed request is only marked (its link, nothing remembered); a followed tool
loop's rounds are one run, a retry is told apart."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from chatgate.runs.tracker import Mark, Round, Runs
from chatgate.settings import Settings


@dataclass
class Caller:
    key_id: str = "fp-1"
    key_name: str = "k"
    team: str = "default"
    caller: str = "hash-1"


@dataclass
class Path:
    history: str | None = "chat"


@dataclass
class Request:
    data: dict[str, Any]
    request_id: str = "r"
    identity: Caller = field(default_factory=Caller)
    route: Path = field(default_factory=Path)
    trace: None = None

    def json(self) -> dict[str, Any]:
        return self.data

    def own_parse(self) -> Any:
        return self.data


TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
TASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Fix the bug"}]
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "42"}


def enter(runs: Runs, data: dict[str, Any], headers: list[tuple[bytes, bytes]] | None = None
          ) -> Round | Mark | None:
    run, refusal = asyncio.run(runs.enter(Request(data), headers or [], data))
    assert refusal is None
    return run


def runs(traced: bool = False) -> Runs:
    return Runs(None, None, Settings().profiles(), 2.0, traced=traced)


def test_a_plain_chat_is_in_no_run_unless_it_names_one() -> None:
    r = runs()
    assert enter(r, {"messages": TASK}) is None
    named = enter(r, {"messages": TASK}, [(b"x-chatgate-run", b"mine")])
    assert type(named) is tuple and named[:2] == ("mine", "header")
    followed = enter(runs(traced=True), {"messages": TASK}, [(b"x-chatgate-run", b"mine")])
    assert isinstance(followed, Round) and followed.live.run_id == "mine" and followed.live.source == "header"


def test_an_unfollowed_round_is_marked_with_its_link_and_nothing_is_remembered() -> None:
    r = runs()
    opening = enter(r, {"messages": TASK, "tools": TOOLS})
    second = enter(r, {"messages": [*TASK, CALL, RESULT], "tools": TOOLS})
    assert type(opening) is tuple and type(second) is tuple
    assert opening[:2] == (None, "inferred") and second[:2] == (None, "inferred")
    assert opening[2] is not None and second[2] is not None and second[2][0] == opening[2][1]
    assert second[2][2] == ("read_file",)
    assert not r._live and not r._prints
    run_id, thread, detail = r.stamp(second, "fp-1", "deepseek-v4-flash", 0)
    assert run_id is None and thread is None
    assert orjson.loads(detail)[6] == [list(second[2][0]), list(second[2][1])]


def test_a_followed_tool_loops_rounds_are_one_run_and_a_retry_is_told_apart() -> None:
    r = runs(traced=True)
    opening = enter(r, {"messages": TASK, "tools": TOOLS})
    second = enter(r, {"messages": [*TASK, CALL, RESULT], "tools": TOOLS})
    again = enter(r, {"messages": [*TASK, CALL, RESULT], "tools": TOOLS})
    assert isinstance(opening, Round) and isinstance(second, Round) and isinstance(again, Round)
    assert opening.live is second.live is again.live
    assert (opening.retry, second.retry, again.retry) == (False, False, True)
    assert second.read is not None and second.read[2] == ("read_file",) and second.live.turns == 3
    began = int(opening.live.run_id[:12], 16) / 1000  # the id begins with the time, in milliseconds
    assert abs(began - time.time()) < 60
