"""The chat family's helpers without HTTP."""

from __future__ import annotations

from typing import Any

import pytest

from chatgate.openai.repairs import calls_of


@pytest.mark.parametrize(("message", "expected"), [
    ({"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "a"}},
                                          {"id": "c2", "type": "function", "function": {"name": "b"}}]},
     (("c1", "c2"), ("a", "b"))),
    ({"role": "assistant", "tool_calls": []}, ((), ())),
    ({"role": "assistant"}, ((), ())),
    ({"role": "assistant", "tool_calls": None}, ((), ())),
    ({"role": "assistant", "tool_calls": {"id": "c1"}}, ((), ())),
    ({"role": "assistant", "tool_calls": [{"id": "c1"}]}, (("c1",), ("",))),  # no function
    ({"role": "assistant", "tool_calls": [{"id": 7, "function": {"name": "a"}}]}, (("7",), ("a",))),
    ({"role": "assistant", "tool_calls": [{"function": {"name": "a"}}, "x"]}, (("", ""), ("a", ""))),
    ({"role": "assistant", "tool_calls": [{"id": "c1", "function": "a"}]}, (("c1",), ("",))),
    ("not a message", ((), ())),
])
def test_calls_of_reads_ids_and_names_whatever_the_shape(message: Any, expected: tuple[Any, Any]) -> None:
    assert calls_of(message) == expected
