"""How runs read a history (chatgate/runs/history.py): each round's link continues the round before it, in
each family; another caller's or task's round is another print; odd histories do not fail."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from chatgate.runs.history import _link, _roles, answered_link, calls_hash, link


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
def test_every_history_is_read_and_its_prints_are_short(name: str) -> None:
    read = link("chat", HISTORIES[name], True)
    assert read is not None
    items = HISTORIES[name]
    assert read == _link("chat", _roles(items), items, True)  # the quick readings give the general prints
    answers = [(i, m) for i, m in enumerate(items) if type(m) is dict and m.get("role") == "assistant"]
    assert read == answered_link(items, answers, True)
    after, own, _ = read
    assert own[0] == len(HISTORIES[name]) and len(str(own[1])) < 80
    assert after is None or len(str(after[1])) < 80


def test_each_round_continues_the_one_before() -> None:
    rounds = [TASK, [*TASK, ONE, result(1)], [*TASK, ONE, result(1), BOTH, result(3), result(4)],
              [*TASK, ONE, result(1), BOTH, result(3), result(4), TWO, result(2)],
              [*TASK, ONE, result(1), BOTH, result(3), result(4), TWO, result(2), TEXT]]
    reads = [link("chat", items, True) for items in rounds]
    assert all(r is not None for r in reads)
    for before, after in itertools.pairwise(reads):
        assert before is not None and after is not None
        assert after[0] == before[1]
    names = [r[2] for r in reads if r is not None]
    assert names == [None, ("read_file",), ("read_file", "run"), ("grep",), ()]


def test_another_task_is_another_print_and_the_same_words_are_told_apart_by_their_anchor() -> None:
    mine = link("chat", [*TASK, ONE, result(1)], True)
    other = link("chat", [TASK[0], {"role": "user", "content": "Write the docs"}, ONE, result(1)], True)
    assert mine is not None and other is not None and mine[0] != other[0]
    # two runs whose last answers are the same words: the tool calls before them tell them apart
    a = link("chat", [*TASK, ONE, result(1), TEXT, {"role": "user", "content": "go on"}], True)
    b = link("chat", [*TASK, TWO, result(2), TEXT, {"role": "user", "content": "go on"}], True)
    assert a is not None and b is not None and a[1] != b[1]
    # with no tool call before them, their tasks do
    c = link("chat", [*TASK, TEXT, {"role": "user", "content": "go on"}], False)
    go_on = {"role": "user", "content": "go on"}
    d = link("chat", [TASK[0], {"role": "user", "content": "Other"}, TEXT, go_on], False)
    assert c is not None and d is not None and c[1] != d[1]


def test_a_plain_chat_opens_no_run_and_odd_items_do_not_fail() -> None:
    assert link("chat", TASK, False) is None
    assert link("chat", [], True) is None
    odd: list[Any] = [1, "two", {"role": "assistant", "tool_calls": [{"id": 3, "function": "f"}]}]
    assert link("chat", odd, True) is not None
    assert calls_hash("chat", odd) != 0


def test_anthropic_and_responses_rounds_continue_the_one_before() -> None:
    user = {"role": "user", "content": "List the files"}
    bash = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}
    use = {"role": "assistant", "content": [{"type": "text", "text": "Looking"}, bash]}
    back = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a b"}]}
    done = {"role": "assistant", "content": [{"type": "text", "text": "Two files."}]}
    rounds = [[user], [user, use, back], [user, use, back, done, {"role": "user", "content": "thanks"}]]
    reads = [link("anthropic", items, True) for items in rounds]
    assert [r[2] if r else "-" for r in reads] == [None, ("Bash",), ()]
    for before, after in itertools.pairwise(reads):
        assert before is not None and after is not None and after[0] == before[1]
    task = {"role": "user", "content": "fix it"}
    call = {"type": "function_call", "call_id": "call_9", "name": "shell", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "call_9", "output": "ok"}
    answer = {"role": "assistant", "type": "message", "content": [{"type": "output_text", "text": "Fixed."}]}
    steps = [[task], [task, call, output], [task, call, output, answer, {"role": "user", "content": "more"}]]
    reads = [link("responses", items, True) for items in steps]
    assert [r[2] if r else "-" for r in reads] == [None, ("shell",), ()]
    for before, after in itertools.pairwise(reads):
        assert before is not None and after is not None and after[0] == before[1]
    again = [task, dict(call, call_id="call_8"), output]  # the same call with the same arguments
    assert calls_hash("responses", steps[1]) == calls_hash("responses", again)


def test_a_plain_chat_without_a_history_is_told_in_a_few_steps() -> None:
    from chatgate.runs.history import no_history

    assert no_history({"messages": TASK})
    assert not no_history({"messages": TASK, "tools": [{"type": "function"}]})
    assert not no_history({"messages": [*TASK, ONE, result(1)]})
    assert not no_history({"messages": [1, "two"]})  # odd items: read the general way
