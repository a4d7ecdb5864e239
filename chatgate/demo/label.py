"""The label `chatgate demo` puts on every answer: it comes from an offline stand-in, not from DeepSeek."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "x-chatgate-demo"
LABEL = "offline stand-in, not DeepSeek"
_HEADER = (HEADER.encode(), LABEL.encode())


class Labelled:
    """ASGI middleware: the label header on every HTTP answer of the wrapped app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def labelled(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), _HEADER]}
            await send(message)

        await self.app(scope, receive, labelled)
