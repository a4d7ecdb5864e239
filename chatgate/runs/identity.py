"""A run's id as the client declares it: the `x-chatgate-run` header, or the session its agent already sends
(Claude Code's `metadata.user_id`, Codex's `prompt_cache_key` and `session_id` header). Pure functions."""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from typing import Any

import orjson

RUN_HEADER = b"x-chatgate-run"
MAX_ID = 128
_ID = re.compile(r"[\x21-\x7e]{1,128}")  # printable ASCII without spaces
# Claude Code's user_id before it became JSON: user_<device>_account_<uuid>_session_<uuid>
_LEGACY_SESSION = re.compile(r"_session_([0-9a-fA-F-]{8,64})$")

Headers = Sequence[tuple[bytes, bytes]]
_name = operator.itemgetter(0)  # the request's, as the ASGI scope has them (names lower-case)


def header(raw: Headers, name: bytes) -> str | None:
    for key, value in raw:
        if key == name:
            return value.decode("latin-1")
    return None


def _clean(value: Any) -> str | None:
    return value if isinstance(value, str) and _ID.fullmatch(value) else None


def claude_session(data: dict[str, Any]) -> str | None:
    """The session id in Claude Code's `metadata.user_id`: a JSON string `{"device_id":…,"session_id":…}`,
    or (earlier versions) `user_…_account_…_session_<uuid>`."""
    metadata = data.get("metadata")
    user = metadata.get("user_id") if type(metadata) is dict else None
    if not isinstance(user, str) or "session" not in user:
        return None
    if user.startswith("{"):
        try:
            parsed = orjson.loads(user)
        except orjson.JSONDecodeError:
            return None
        return _clean(parsed.get("session_id")) if type(parsed) is dict else None
    found = _LEGACY_SESSION.search(user)
    return found.group(1) if found else None


def codex_conversation(data: dict[str, Any], raw: Headers) -> str | None:
    """Codex's conversation id: `prompt_cache_key` in the body (it is the conversation id), else its
    `session_id` or `conversation_id` header."""
    key = _clean(data.get("prompt_cache_key"))
    if key is not None:
        return key
    return _clean(header(raw, b"session_id") or header(raw, b"conversation_id"))


def names_a_run(raw: Headers) -> bool:
    return RUN_HEADER in map(_name, raw)  # (the test in C)


def declared(kind: str, data: dict[str, Any], raw: Headers) -> tuple[str, str] | None:
    """(run id, source) when the client names the run: `x-chatgate-run` (source "header"), else its agent's
    session ("session"); None: the run is inferred from the history."""
    explicit = header(raw, RUN_HEADER) if names_a_run(raw) else None
    if explicit is not None:
        value = explicit.strip()
        return (value, "header") if _ID.fullmatch(value) else None
    if kind == "anthropic":
        session = claude_session(data)
        if session is not None:
            return f"claude-{session}", "session"
    elif kind == "responses":
        conversation = codex_conversation(data, raw)
        if conversation is not None:
            return f"codex-{conversation}", "session"
    return None

