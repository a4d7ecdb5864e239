"""Ids chatgate makes: random, so that nobody can guess another request's (issue 48: a per-process prefix
and a counter let a client name the next request's id).

The random bytes come from the operating system (os.urandom, as `secrets` uses) a page at a time, not a
system call per id: two ids a request each cost a getrandom(2) call, which measured ~3% of a tool-loop
request's CPU (docs/performance.md)."""

from __future__ import annotations

import os
import threading
import time

_PAGE = 4096  # 256 ids' worth of random bytes per system call
_lock = threading.Lock()  # ids are made on the event loop and in the recorder's and checkers' threads
_page = b""
_at = _PAGE


def _random(n: int) -> bytes:
    global _page, _at
    with _lock:
        if _at + n > len(_page):
            _page, _at = os.urandom(_PAGE), 0
        start = _at
        _at = start + n
        return _page[start:start + n]


def new_id() -> str:
    """32 hex characters, like uuid4().hex: 128 random bits."""
    return _random(16).hex()


def ordered_id() -> str:
    """32 hex characters: the time in milliseconds (12), then 80 random bits. Ids made later sort later, so
    an index on them grows at its end instead of at random places (an agent run's id: chatgate/runs/)."""
    return ((time.time_ns() // 1_000_000).to_bytes(6, "big") + _random(10)).hex()
