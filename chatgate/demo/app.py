"""The whole fake: chat from `chatgate.demo.deepseek`, with the routes the other modules answer."""

from __future__ import annotations

from chatgate.demo import anthropic, files, fim, responses, tools
from chatgate.demo.deepseek import FakeDeepSeek, FakeState, Route

ROUTES = (
    Route(fim.PATHS.__contains__, fim.serve),  # FIM and the balance
    Route(files.owns, files.serve),
    Route(tools.PATHS.__contains__, tools.serve),
    Route(responses.PATHS.__contains__, responses.serve),
    Route(anthropic.PATHS.__contains__, anthropic.serve_messages),
)


def create_fake_app(state: FakeState | None = None) -> FakeDeepSeek:
    """A fake DeepSeek ASGI app; its `.state` is the given (or a fresh) FakeState."""
    return FakeDeepSeek(state if state is not None else FakeState(), ROUTES)
