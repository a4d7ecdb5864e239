"""Unique ids without a syscall per request: a random per-process prefix and a counter."""

from __future__ import annotations

import itertools
import os

_PREFIX = os.urandom(8).hex()
_COUNTER = itertools.count()


def new_id() -> str:
    """32 hex characters, like uuid4().hex; unique across processes and restarts (random prefix)."""
    return f"{_PREFIX}{next(_COUNTER):016x}"
