"""Whose files a caller of the Files API sees in managed mode. DeepSeek keeps files per API key, and managed
mode asks it with one key for every client key, so chatgate records which team uploaded each file (the store's
file_owners) and a client key sees its team's files only: another team's file is the 404 of an unknown id,
never forwarded, and is left out of a list.

A list is filtered page by page: DeepSeek's page is kept for the caller's team, and when that leaves fewer
files than the caller asked for while DeepSeek has more, the next pages are asked for (after the last file
seen, LIST_MAX at a time, at most MAX_LIST_PAGES in all) until the page is full or DeepSeek has no more.
`first_id`, `last_id` and `has_more` then describe the files returned, so a client that pages with
`after=<last_id>` (the SDKs do) walks its team's files and no other's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlencode

import orjson

from chatgate.errors import APIError, no_such_file, store_unavailable
from chatgate.store.base import FileOwner, FileOwnerStore, StoreError

log = logging.getLogger("chatgate")

LIST_MAX = 1000  # DeepSeek's largest (and default) `limit` for a list, per its Files API guide
MAX_LIST_PAGES = 100  # DeepSeek's pages one list may ask for: then it answers with what it has, has_more true
T = TypeVar("T")


class Owners:
    """The files of one caller's team: a client key's in managed mode (`key_id`: the key that uploads)."""

    def __init__(self, store: FileOwnerStore, team: str, key_id: str) -> None:
        self.store = store
        self.team = team
        self.key_id = key_id

    async def owns(self, file_id: str) -> bool:
        owner = await _ask(self.store.file_owner, file_id)
        return owner is not None and owner.team == self.team

    async def owned(self, file_ids: Sequence[str]) -> set[str]:
        return await _ask(self.store.files_owned, self.team, file_ids) if file_ids else set()

    async def record(self, file_id: str, tokens: int | None = None) -> None:
        owner = FileOwner(file_id, self.team, self.key_id, time.time(), tokens)
        await _ask(self.store.own_file, owner)


async def foreign_file(store: FileOwnerStore, team: str, refs: Sequence[tuple[str, str]]) -> APIError | None:
    """Managed mode: DeepSeek keeps every team's uploads under the one upstream key, so a request may name
    only files its key's team uploaded through chatgate; the first other one, by its (param, file id) in
    `refs`, is the 404 of an unknown file, as on the Files routes."""
    if not refs:
        return None
    try:
        owned = await asyncio.to_thread(store.files_owned, team,
                                        list(dict.fromkeys(file_id for _, file_id in refs)))
    except StoreError:
        return store_unavailable()
    return next((no_such_file(file_id, param) for param, file_id in refs if file_id not in owned), None)


async def forget(store: FileOwnerStore | None, file_id: str) -> None:
    """The owner of a file DeepSeek has just deleted. A failure is only logged: the row of a file that no
    longer exists grants nothing."""
    if store is None:
        return
    try:
        await asyncio.to_thread(store.disown_file, file_id)
    except StoreError as exc:
        log.warning("could not forget the owner of deleted file %s: %s", file_id, exc)


async def _ask(call: Callable[..., T], *args: Any) -> T:
    try:
        return await asyncio.to_thread(call, *args)
    except StoreError as exc:
        raise store_unavailable() from exc


def uploaded_id(status: int, content: bytes) -> str | None:
    """The id of the file a successful upload answer describes; None for any other answer."""
    if not 200 <= status < 300:
        return None
    found = _json(content)
    file_id = found.get("id") if isinstance(found, dict) else None
    return file_id if isinstance(file_id, str) and file_id else None


def listing(content: bytes) -> dict[str, Any] | None:
    """DeepSeek's list as it sent it, if it is one: an object whose `data` holds files with string ids."""
    found = _json(content)
    if not isinstance(found, dict) or not isinstance(data := found.get("data"), list):
        return None
    if not all(isinstance(f, dict) and isinstance(f.get("id"), str) for f in data):
        return None
    return found


def narrowed(found: dict[str, Any], kept: list[dict[str, Any]], has_more: bool) -> bytes:
    """The list with `kept` as its files, its cursor fields (those DeepSeek sent) describing them."""
    out = {**found, "data": kept}
    if "first_id" in out:
        out["first_id"] = kept[0]["id"] if kept else None
    if "last_id" in out:
        out["last_id"] = kept[-1]["id"] if kept else None
    if "has_more" in out:
        out["has_more"] = has_more
    return orjson.dumps(out)


def wanted(params: list[tuple[str, str]]) -> int:
    """How many files the caller asked for (DeepSeek refuses a bad `limit` itself, before this matters)."""
    limit = _last(params, "limit")
    return int(limit) if limit is not None and limit.isdigit() and int(limit) > 0 else LIST_MAX


def after(params: list[tuple[str, str]]) -> str | None:
    return _last(params, "after")


def next_query(params: list[tuple[str, str]], last_seen: str) -> str:
    """The query for DeepSeek's next page: the caller's filters and order, after the last file seen."""
    kept = [(k, v) for k, v in params if k not in ("after", "limit")]
    return urlencode([*kept, ("after", last_seen), ("limit", str(LIST_MAX))])


def _last(params: list[tuple[str, str]], name: str) -> str | None:
    values = [v for k, v in params if k == name]
    return values[-1] if values else None


def _json(content: bytes) -> Any:
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
