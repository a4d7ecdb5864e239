"""Ids chatgate makes: random, so that nobody can guess another request's (issue 48: a per-process prefix
and a counter let a client name the next request's id)."""

from __future__ import annotations

import secrets


def new_id() -> str:
    """32 hex characters, like uuid4().hex: 128 random bits."""
    return secrets.token_hex(16)
