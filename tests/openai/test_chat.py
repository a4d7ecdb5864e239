"""The chat family's helpers without HTTP."""

from __future__ import annotations

from typing import Any

import pytest

from app.openai.repairs import calls_of


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


def test_file_refs_finds_both_forms_of_file_part_and_nothing_else() -> None:
    from app.openai.chat import file_refs

    body = {"messages": [
        {"role": "system", "content": "file_id: not a part"},
        {"role": "user", "content": [{"type": "text", "text": "two files"},
                                     {"type": "file", "file_id": "file-flat"},
                                     {"type": "file", "file": {"file_id": "file-sdk", "filename": "a.pdf"}},
                                     {"type": "file", "file_data": "data:application/pdf;base64,AAAA"},
                                     {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "file", "file_id": "file-tool"}]},
        "not a message", {"role": "user", "content": [{"type": "file", "file_id": ""}, 7]}]}
    assert file_refs(body) == [("messages[1].content[1].file_id", "file-flat"),
                               ("messages[1].content[2].file.file_id", "file-sdk"),
                               ("messages[2].content[0].file_id", "file-tool")]
    assert file_refs({"messages": "nope"}) == [] and file_refs({}) == []
