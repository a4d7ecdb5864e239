"""How runs read a history (chatgate/runs/history.py): the quick reading of an agent's chat round gives the
same prints as the general one, and a round continues the one before it."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from chatgate.runs.history import _shape, shape


def call(n: int, name: str = "read_file", args: str = '{"path": "a.py"}') -> dict[str, Any]:
    return {"id": f"call_{n:02d}_x", "type": "function", "function": {"name": name, "arguments": args}}


TASK: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."},
                              {"role": "user", "content": "Fix the bug"}]
ONE = {"role": "assistant", "content": None, "tool_calls": [call(1)]}
TWO = {"role": "assistant", "content": "", "tool_calls": [call(2, "grep", '{"p": "x"}')]}
BOTH = {"role": "assistant", "content": None, "tool_calls": [call(3), call(4, "run")]}
TEXT = {"role": "assistant", "content": "Done."}


def result(n: int) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": f"call_{n:02d}_x", "content": "42 lines"}


HISTORIES = {
    "opening": TASK,
    "round 2": [*TASK, ONE, result(1)],
    "round 3": [*TASK, ONE, result(1), TWO, result(2)],
    "after parallel calls": [*TASK, BOTH, result(3), result(4), ONE, result(1)],
    "parallel calls last": [*TASK, ONE, result(1), BOTH, result(3), result(4)],
    "a text answer last": [*TASK, ONE, result(1), TEXT, {"role": "user", "content": "go on"}],
    "text, then a call": [*TASK, TEXT, {"role": "user", "content": "go on"}, ONE, result(1)],
    "no task before the answer": [ONE, result(1)],
}


@pytest.mark.parametrize("name", HISTORIES)
def test_the_quick_reading_gives_the_general_prints(name: str) -> None:
    items = HISTORIES[name]
    assert shape("chat", items, "fp-1", True) == _shape("chat", items, "fp-1", True)


def test_each_round_continues_the_one_before() -> None:
    rounds = [TASK, [*TASK, ONE, result(1)], [*TASK, ONE, result(1), BOTH, result(3), result(4)],
              [*TASK, ONE, result(1), BOTH, result(3), result(4), TWO, result(2)],
              [*TASK, ONE, result(1), BOTH, result(3), result(4), TWO, result(2), TEXT]]
    reads = [shape("chat", items, "fp-1", True) for items in rounds]
    assert all(r is not None for r in reads)
    for before, after in itertools.pairwise(reads):
        assert before is not None and after is not None
        assert after[0] == before[1]
    names = [r[2] for r in reads if r is not None]
    assert names == [None, ("read_file",), ("read_file", "run"), ("grep",), ()]


def test_another_caller_or_task_is_another_run() -> None:
    items = [*TASK, ONE, result(1)]
    mine = shape("chat", items, "fp-1", True)
    assert mine is not None
    assert shape("chat", items, "fp-2", True) != mine
    other = [TASK[0], {"role": "user", "content": "Write the docs"}, ONE, result(1)]
    assert shape("chat", other, "fp-1", True) != mine


def test_a_plain_chat_opens_no_run_and_odd_items_do_not_fail() -> None:
    assert shape("chat", TASK, "fp-1", False) is None
    assert shape("chat", [], "fp-1", True) is None
    odd: list[Any] = [1, "two", {"role": "assistant", "tool_calls": [{"id": 3, "function": "f"}]}]
    assert shape("chat", odd, "fp-1", True) == _shape("chat", odd, "fp-1", True)


def test_a_plain_chat_without_a_history_is_told_in_a_few_steps() -> None:
    from chatgate.runs.history import no_history

    assert no_history({"messages": TASK})
    assert not no_history({"messages": TASK, "tools": [{"type": "function"}]})
    assert not no_history({"messages": [*TASK, ONE, result(1)]})
    assert not no_history({"messages": [1, "two"]})  # odd items: read the general way
