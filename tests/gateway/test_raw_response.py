"""`RawResponse`: DeepSeek's non-streaming answer as it came, and the usage record spooled before any of it
is sent (the README's durability promise: once the client has the end of its answer, its record survives a
`kill -9`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from chatgate.gateway.responses import RawResponse

HEADERS = [(b"content-type", b"application/json")]


def run(response: RawResponse, send: Any) -> None:
    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    asyncio.run(response({"type": "http"}, receive, send))


def test_the_record_is_made_before_anything_is_sent() -> None:
    events: list[str] = []

    async def send(message: dict[str, Any]) -> None:
        events.append(message["type"])

    run(RawResponse(200, HEADERS, b'{"ok":true}', lambda: events.append("recorded")), send)
    assert events == ["recorded", "http.response.start", "http.response.body"]


def test_headers_and_body_are_sent_as_they_came_with_their_length() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    run(RawResponse(429, HEADERS, b'{"error":{}}'), send)
    assert sent[0] == {"type": "http.response.start", "status": 429,
                       "headers": [*HEADERS, (b"content-length", b"12")]}
    assert sent[1] == {"type": "http.response.body", "body": b'{"error":{}}'}


def test_a_client_gone_mid_send_still_leaves_its_record() -> None:
    recorded: list[bool] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            raise OSError("client disconnected")

    with pytest.raises(OSError):
        run(RawResponse(200, HEADERS, b"{}", lambda: recorded.append(True)), send)
    assert recorded == [True]
