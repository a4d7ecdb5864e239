"""OneWriteResponses (app/server.py): a response's head and its body's first write go out in one write."""

from __future__ import annotations

import asyncio
from typing import Any

from app.server import OneWriteResponses


class Transport:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", data))

    def writelines(self, lines: tuple[bytes, ...]) -> None:
        self.calls.append(("writelines", b"".join(lines)))

    def close(self) -> None:
        self.closed = True
        self.calls.append(("close", None))

    def is_closing(self) -> bool:
        return self.closed


def test_a_head_and_its_body_are_one_write() -> None:
    asyncio.run(_test_a_head_and_its_body_are_one_write())


async def _test_a_head_and_its_body_are_one_write() -> None:
    t = Transport()
    out = OneWriteResponses(t, asyncio.get_running_loop())  # type: ignore[arg-type]
    out.arm()
    out.write(b"HTTP/1.1 200 OK\r\n\r\n")
    out.write(b"{}")
    out.write(b"more")
    assert t.calls == [("writelines", b"HTTP/1.1 200 OK\r\n\r\n{}"), ("write", b"more")]
    await asyncio.sleep(0)
    assert len(t.calls) == 2  # the turn's flush found nothing held


def test_a_head_alone_goes_out_at_the_end_of_the_turn() -> None:
    asyncio.run(_test_a_head_alone_goes_out_at_the_end_of_the_turn())


async def _test_a_head_alone_goes_out_at_the_end_of_the_turn() -> None:
    t = Transport()
    out = OneWriteResponses(t, asyncio.get_running_loop())  # type: ignore[arg-type]
    out.arm()
    out.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    assert t.calls == []
    await asyncio.sleep(0)
    assert t.calls == [("write", b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")]
    out.write(b"5\r\nhello\r\n")  # not armed: written as it comes
    assert t.calls[-1] == ("write", b"5\r\nhello\r\n")


def test_close_sends_what_is_held_first() -> None:
    asyncio.run(_test_close_sends_what_is_held_first())


async def _test_close_sends_what_is_held_first() -> None:
    t = Transport()
    out = OneWriteResponses(t, asyncio.get_running_loop())  # type: ignore[arg-type]
    out.arm()
    out.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    out.close()
    assert t.calls == [("write", b"HTTP/1.1 204 No Content\r\n\r\n"), ("close", None)]
    assert out.is_closing()
