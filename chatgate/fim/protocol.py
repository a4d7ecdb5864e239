"""Wire model of DeepSeek's FIM completion request, `POST /beta/completions` (docs/rules-fim.md).

Like the chat request (chatgate/openai/protocol.py): unknown fields are accepted (F14) and forwarded
untouched, types are strict because DeepSeek's deserializer is. Fields the FIM reference does not type are
kept as `Any`: the deprecated penalties ("will not take effect") and the chat-only `thinking` /
`reasoning_effort`, which DeepSeek treats as unknown fields here. The rules in rules.py look at them, never
the type check.
"""

from __future__ import annotations

from typing import Any

from chatgate.openai.protocol import ChatWireModel, StreamOptions


class FimRequest(ChatWireModel):
    model: str
    prompt: str
    suffix: str | None = None
    echo: bool | None = None
    logprobs: int | None = None
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    frequency_penalty: Any = None
    presence_penalty: Any = None
    thinking: Any = None
    reasoning_effort: Any = None
