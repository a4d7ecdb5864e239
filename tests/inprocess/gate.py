"""chatgate in-process: `create_app(settings, transport=…)` driven through httpx2's ASGITransport, with the
fake DeepSeek as its upstream through a second ASGITransport. No socket, no thread: the whole request path
(chatgate/gateway/proxy.py, ledger.py, exchange.py, state.py) runs on the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import orjson

from chatgate.demo.app import create_fake_app
from chatgate.demo.deepseek import FakeState
from chatgate.gateway.state import State
from chatgate.web.app import create_app
from tests.gateway.conftest import _read_usage
from tests.harness import make_settings

KEY = "sk-inprocess-client-0001"
UPSTREAM = "http://deepseek.test"


@dataclass
class Gate:
    client: httpx2.AsyncClient
    state: State
    fake: FakeState
    db: Path

    async def post(self, path: str, body: dict[str, Any] | bytes, key: str = KEY, **headers: str
                   ) -> httpx2.Response:
        content = body if isinstance(body, bytes) else orjson.dumps(body)
        sent = {"content-type": "application/json", "authorization": f"Bearer {key}", "x-api-key": key,
                **headers}
        return await self.client.post(path, content=content, headers=sent)

    async def records(self, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """The usage table's rows once there are `count` (the recorder writes them off the request)."""
        deadline = time.monotonic() + timeout
        while True:
            rows = await asyncio.to_thread(_read_usage, self.db)
            if len(rows) >= count or time.monotonic() > deadline:
                return rows
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def gate(tmp_path: Path, fake: FakeState | None = None, **sections: dict[str, Any]
               ) -> AsyncIterator[Gate]:
    fake = fake if fake is not None else FakeState()
    settings = make_settings(tmp_path, UPSTREAM, **sections)
    app = create_app(settings, transport=httpx2.ASGITransport(app=create_fake_app(fake)))
    state: State = app.state.chatgate
    client = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://gate", timeout=20)
    async with app.router.lifespan_context(app), client:
        yield Gate(client, state, fake, tmp_path / "usage.db")


def run(tmp_path: Path, scenario: Callable[[Gate], Awaitable[None]], fake: FakeState | None = None,
        **sections: dict[str, Any]) -> None:
    async def main() -> None:
        async with gate(tmp_path, fake, **sections) as g:
            await scenario(g)

    asyncio.run(main())


def chat(content: str = "What is the capital of France?", **extra: Any) -> dict[str, Any]:
    return {"model": "deepseek-flash", "messages": [{"role": "user", "content": content}], **extra}


def events(text: str) -> list[dict[str, Any]]:
    """The JSON data events of an SSE body."""
    return [orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
