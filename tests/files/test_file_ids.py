"""Managed mode checks the owner of every file a request names, wherever it names it (issue 34 §5): an
Anthropic `system` document block, a Responses `instructions` input_file, a tool result, as well as the
usual content parts; tool calls' arguments and schemas are data, not files."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from chatgate.files.file_ids import may_name_files, named_files
from chatgate.store.sqlite import SQLiteStore
from tests.fakes.server import RunningFake
from tests.files.test_files import Teams, start_teams

Body = Callable[[str], dict[str, Any]]
BETA = {"anthropic-beta": "files-api-2025-04-14"}


@pytest.fixture
def teams(tmp_path: Path, fake: RunningFake) -> Iterator[Teams]:
    with start_teams(tmp_path, fake, SQLiteStore(tmp_path / "usage.db")) as started:
        yield started


PLACES: list[tuple[str, Body, str]] = [
    ("/anthropic/v1/messages",
     lambda f: {"model": "deepseek-flash", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}],
                "system": [{"type": "text", "text": "read this"},
                           {"type": "document", "source": {"type": "file", "file_id": f}}]},
     "system[1].source.file_id"),
    ("/v1/responses",
     lambda f: {"model": "deepseek-flash", "input": "hi",
                "instructions": [{"role": "developer", "content": [{"type": "input_file", "file_id": f}]}]},
     "instructions[0].content[0].file_id"),
    ("/v1/responses",
     lambda f: {"model": "deepseek-flash", "input": [{"type": "message", "role": "user", "content": [
         {"type": "input_text", "text": "x"}, {"type": "input_image", "file_id": f, "detail": "auto"}]}]},
     "input[0].content[1].file_id"),
    ("/anthropic/v1/messages",
     lambda f: {"model": "deepseek-flash", "max_tokens": 100, "messages": [
         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
             {"type": "image", "source": {"type": "file", "file_id": f}}]}]}]},
     "messages[0].content[0].content[0].source.file_id"),
]


@pytest.mark.parametrize(("path", "body", "param"), PLACES)
def test_another_teams_file_is_404_wherever_the_body_names_it(
        teams: Teams, fake: RunningFake, path: str, body: Body, param: str) -> None:
    theirs = teams.upload("b1")
    before = len(fake.state.requests)
    resp = httpx2.post(teams.gate.url + path, json=body(theirs), timeout=20, headers={
        "authorization": f"Bearer {teams.keys['a1'][1]}", **BETA})
    assert resp.status_code == 404, resp.text
    assert f"No such file: {theirs}" in resp.text and param in resp.text
    assert len(fake.state.requests) == before, "nothing reached DeepSeek"


@pytest.mark.parametrize(("path", "body", "param"), PLACES[:2])
def test_the_teams_own_file_there_is_forwarded(teams: Teams, fake: RunningFake, path: str, body: Body,
                                               param: str) -> None:
    mine = teams.upload("a1")
    resp = httpx2.post(teams.gate.url + path, json=body(mine), timeout=20, headers={
        "authorization": f"Bearer {teams.keys['a2'][1]}", **BETA})
    assert resp.status_code != 404, resp.text
    assert fake.state.requests[-1].path in ("/anthropic/v1/messages", "/responses")


def test_tool_arguments_and_schemas_are_not_files() -> None:
    from chatgate.files.file_ids import file_refs
    body = {
        "tools": [{"name": "open", "input_schema": {"properties": {"file_id": {"type": "string"}},
                                                    "examples": [{"file_id": "file-example"}]}}],
        "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "open",
                                               "input": {"file_id": "file-an-argument"}}]},
            {"role": "user", "content": [
                {"type": "file", "file": {"file_id": "file-sdk"}}, {"type": "file", "file_id": "file-flat"},
                {"type": "file", "file_id": ""}, 7]},
        ],
        "metadata": {"file_id": "file-meta"}}
    assert file_refs(body) == [("messages[1].content[0].file.file_id", "file-sdk"),
                               ("messages[1].content[1].file_id", "file-flat")]
    assert file_refs({"messages": "nope"}) == [] and file_refs([]) == []


def test_a_checked_body_may_name_files_only_by_file_id_or_an_ascii_escape() -> None:
    """The letters of `file_id` escape only as \\u00XX: a checked body with other escapes names no file; an
    unchecked one may still be unreadable (refused by named_files), so any escape sends it there."""
    other = b'{"content":"caf\\u00e9 \\u65e5"}'.replace(b"\\u00e9", b"\\u2603")
    assert not may_name_files(other, json=True) and may_name_files(other)
    assert named_files(other) == []
    for key in (b"file_id", b"file\\u005fid", b"\\u0066ile_id", b"file_i\\u0064"):
        body = b'{"type":"file","' + key + b'":"file-1"}'
        assert may_name_files(body, json=True) and may_name_files(body)
        assert named_files(body) == [("file_id", "file-1")]
