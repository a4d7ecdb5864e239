"""A test build of chatgate: the CLI, with a pause of `PAUSEBUILD_SEND_PAUSE` seconds (default 5) before a
non-streaming answer goes to the client. The durability test kills it during the pause to show that the
usage record was spooled before the client could have received any of the answer.

    python -m tests.pausebuild serve [ARGS…]
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from chatgate.cli import main
from chatgate.gateway.responses import RawResponse

PAUSE = float(os.environ.get("PAUSEBUILD_SEND_PAUSE", "5"))
SIGNAL_FILE = os.environ.get("PAUSEBUILD_PAUSED_FILE")  # touched when a pause begins

_call = RawResponse.__call__


async def _paused_call(self: RawResponse, scope: Any, receive: Any, send: Any) -> None:
    async def paused_send(message: Any) -> None:
        if message["type"] == "http.response.start":
            if SIGNAL_FILE:
                with open(SIGNAL_FILE, "a") as f:
                    f.write("paused\n")
            await asyncio.sleep(PAUSE)
        await send(message)

    await _call(self, scope, receive, paused_send)


RawResponse.__call__ = _paused_call  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
