"""relay.Relayed, the client's side of a relayed answer, through its ASGI seam: a client that stops reading is
given up on at the deadline (the gateway's generator is closed, so it makes its record) instead of holding
the relay open; a client that reads gets every piece."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from chatgate.gateway.relay import Head, Piece, Relayed

PIECES: list[Piece] = [(b"data: 1\n\n", False), (b"data: 2\n\n", False), (b"data: [DONE]\n\n", True)]


def pieces(closed: list[str]) -> AsyncGenerator[Head | Piece, None]:
    async def gen() -> AsyncGenerator[Head | Piece, None]:
        try:
            for piece in PIECES:
                yield piece
        finally:
            closed.append("closed")  # where the gateway's generator makes the record if nothing did
    return gen()


async def never_disconnects() -> dict[str, Any]:
    await asyncio.Event().wait()
    return {}


def test_a_client_that_stops_reading_is_given_up_on_at_the_deadline() -> None:
    closed: list[str] = []
    sent: list[dict[str, Any]] = []

    async def stuck_send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body":
            await asyncio.Event().wait()  # the client's window is full and stays full

    async def main() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        relayed = Relayed(pieces(closed), Head(200, []), None, deadline=start + 0.3)
        await asyncio.wait_for(relayed({"type": "http"}, never_disconnects, stuck_send), 10)
        return loop.time() - start

    took = asyncio.run(main())
    assert 0.25 <= took < 5, took
    assert closed == ["closed"]
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]


def test_a_client_that_reads_gets_every_piece_before_the_deadline() -> None:
    closed: list[str] = []
    bodies: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            bodies.append(message["body"])
            assert message["more_body"] is (len(bodies) < len(PIECES))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        relayed = Relayed(pieces(closed), Head(200, []), None, deadline=loop.time() + 5)
        await relayed({"type": "http"}, never_disconnects, send)

    asyncio.run(main())
    assert bodies == [body for body, _ in PIECES] and closed == ["closed"]
