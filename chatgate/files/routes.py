"""DeepSeek's Files API, `/files…` (also under `/v1`), passed through: an upload is streamed to DeepSeek as it
arrives (at most limits.max_file_bytes), DeepSeek's answer is relayed as it comes, errors included.

The caller is authenticated as on every route (managed: a missing, unknown or revoked key is a 401, and the
upstream key goes to DeepSeek; passthrough: the caller's own key goes through). In managed mode a client key
sees its team's files only (owners.py), and the admin key sees every file. Nothing is validated
and nothing is metered: there are no tokens, so no usage record and no quotas; each request gets an access-log
line and a count in /metrics under its route template (never a file id). The Anthropic-format Files API,
`/anthropic/v1/files…`, is forwarded the same way (managed mode: the admin key only).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any
from urllib.parse import parse_qsl, quote

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from chatgate.errors import NOT_OWNED, APIError, bad_gateway, no_such_file, not_found, upstream_auth_failed
from chatgate.files.documents import DocumentCount
from chatgate.files.owners import (
    MAX_LIST_PAGES,
    Owners,
    after,
    forget,
    listing,
    narrowed,
    next_query,
    uploaded_id,
    wanted,
)
from chatgate.files.passthrough import OnEnd, Passthrough
from chatgate.gateway.auth import Identity, client_key
from chatgate.gateway.bodies import BodyStopped, Upload, request_id_of
from chatgate.gateway.family import Family
from chatgate.gateway.ledger import Ledger
from chatgate.gateway.responses import RawResponse, error_response
from chatgate.gateway.state import State
from chatgate.gateway.upstream import (
    Answer,
    forward_headers,
    map_transport_error,
    read_whole,
    response_headers,
)

log = logging.getLogger("chatgate")

FILES = "/files"
# (route template, the methods DeepSeek serves on it); each is also served under /v1
ROUTES: tuple[tuple[str, list[str]], ...] = (
    (FILES, ["GET", "POST"]),
    (FILES + "/{file_id}", ["GET", "DELETE"]),
    (FILES + "/{file_id}/content", ["GET"]),
)
# DeepSeek's Anthropic-format Files API (`anthropic-beta: files-api-2025-04-14`), same operations, under
# /anthropic/v1: forwarded in passthrough mode; in managed mode chatgate cannot keep its files per team yet
# (its lists page with after_id/before_id), so only the admin key is forwarded there.
ANTHROPIC = "/anthropic/v1"
NOT_IDS = frozenset({".", ".."})  # segments a URL resolves away: forwarded, they would reach another route
LIMIT_SETTING = "limits.max_file_bytes"


def add_files(app: FastAPI, state: State) -> None:
    anthropic = state.endpoints[ANTHROPIC + "/messages"].family  # its error shape
    for template, methods in ROUTES:
        handler = _handler(state, template)
        for prefix in ("", "/v1"):
            app.router.add_route(prefix + template, handler, methods=methods, include_in_schema=False)
        app.router.add_route(ANTHROPIC + template, _handler(state, template, ANTHROPIC, anthropic),
                             methods=methods, include_in_schema=False)


def _handler(state: State, template: str, prefix: str = "", family: Family | None = None) -> Any:
    """One Files API route: `prefix` is DeepSeek's (and the route's label's), `family` the error shape."""
    route = prefix + template

    async def files(request: Request) -> Response:
        gw, ts, t0, rid = state.gw, time.time(), time.perf_counter(), request_id_of(request)
        try:
            identity, owners = await _caller(state, client_key(request.headers), teams=not prefix)
        except APIError as error:
            gw.ledger.refused(route, rid, error.status, error.code, ts)
            return error_response(error, rid, family)
        done = functools.partial(_note, gw.ledger, route, rid, ts, t0, identity, request.method)
        limits = state.settings.limits
        upload = Upload(request, limits.max_file_bytes, LIMIT_SETTING, limits.upload_min_bytes_per_second,
                        state.settings.server.head_timeout_seconds)
        try:
            path = prefix + _upstream_path(template, request)
            upload.check()
            if owners is not None and not await _owned(owners, request):
                done("refused", 404, NOT_OWNED)
                return error_response(no_such_file(request.path_params["file_id"]), rid)
        except APIError as error:
            done("refused", error.status, error.code)
            return error_response(error, rid, family)
        headers = _headers(request, identity, rid, gw.auth.managed)
        deadline = t0 + state.settings.upstream.total_timeout
        if owners is not None and template == FILES and request.method == "GET":
            return await _team_list(state, request, owners, headers, deadline, done)
        return await _exchange(state, request, path, upload, identity, owners, headers, deadline, done,
                               family)
    return files


async def _caller(state: State, authorization: str | None, teams: bool = True
                  ) -> tuple[Identity, Owners | None]:
    """Who calls, and the team whose files alone it sees: a client key's in managed mode. The admin key sees
    every file DeepSeek keeps for the upstream key; in passthrough mode DeepSeek itself keeps each key's.
    Where chatgate cannot keep files per team (`teams` false), a managed client key is refused."""
    auth = state.gw.auth
    admin = auth.admin(authorization)
    if admin is not None:
        return admin, None
    identity = await auth.identify(authorization)
    if not auth.managed:
        return identity, None
    if not teams:
        raise APIError(404, "The Anthropic-format Files API is not served in managed mode yet: chatgate "
                       "cannot keep each team's files apart on it. Use the Files API at /v1/files (or the "
                       "admin key).", "not_found_error", None, "not_served")
    assert state.store is not None, "a managed client key is only identified with a store"
    return identity, Owners(state.store, identity.team, identity.key_id)


async def _owned(owners: Owners, request: Request) -> bool:
    """Whether the file the request names, if any, is the caller's team's."""
    file_id = request.path_params.get("file_id")
    return file_id is None or await owners.owns(file_id)


async def _exchange(state: State, request: Request, path: str, upload: Upload, identity: Identity,
                    owners: Owners | None, headers: list[tuple[bytes, bytes]], deadline: float, done: OnEnd,
                    family: Family | None = None) -> Response:
    """The request forwarded, DeepSeek's answer relayed: streamed, but for an upload a team will own (read
    whole, so that its owner is recorded before the caller has the id)."""
    gw, rid = state.gw, request_id_of(request)
    body = upload if _has_body(request) else None
    document = None
    if owners is not None and request.method == "POST" and body is not None:
        document = DocumentCount(request.headers.get("content-type", ""))
        upload.tap = document.feed
    url = gw.upstream.url_of(path, request.scope["query_string"].decode("latin-1"))
    try:
        async with asyncio.timeout(_left(deadline)):
            resp = await gw.upstream.send(request.method, url, headers, body)
    except (APIError, BodyStopped, TimeoutError) as exc:
        if upload.client_gone:
            done("client_disconnected", 499, None)
            return Response(status_code=499)  # nobody reads it
        failure, outcome = _failure(upload, exc)
        done(outcome, failure.status, failure.code)
        return error_response(failure, rid, family)
    if resp.status_code == 401 and gw.auth.managed:  # chatgate's own key refused: never DeepSeek's text
        await resp.aclose()
        failure = upstream_auth_failed(rid)
        done("upstream_error", failure.status, failure.code)
        return error_response(failure, rid, family)
    if request.method == "DELETE" and gw.auth.managed and 200 <= resp.status_code < 300:
        await forget(state.store, request.path_params["file_id"])
    if owners is not None and request.method == "POST":
        tokens = document.tokens() if document is not None and upload.done else None
        return await _owned_upload(state, owners, identity, resp, rid, deadline, done, tokens)
    return Passthrough(resp, rid, deadline, done, watch=body is None or upload.done)


async def _owned_upload(state: State, owners: Owners, identity: Identity, resp: Answer, rid: str,
                        deadline: float, done: OnEnd, tokens: int | None = None) -> Response:
    """DeepSeek's answer to an upload, relayed unchanged once the file it made is recorded as the team's. If
    it cannot be recorded, the file is deleted (nobody could have reached it) and the upload fails."""
    try:
        content = await read_whole(resp, deadline)
    except APIError as failure:
        done("upstream_failed", failure.status, failure.code)
        return error_response(failure, rid)
    file_id = uploaded_id(resp.status_code, content)
    if file_id is not None:
        try:
            await owners.record(file_id, tokens)
        except APIError as error:
            await _discard(state, file_id, identity, rid)
            done("aborted", error.status, error.code)
            return error_response(error, rid)
    outcome = "ok" if 200 <= resp.status_code < 300 else "upstream_error"
    return RawResponse(resp.status_code, response_headers(resp.raw_headers, rid), content,
                       before_send=functools.partial(done, outcome, resp.status_code, None))


async def _discard(state: State, file_id: str, identity: Identity, rid: str) -> None:
    """Delete a file at DeepSeek, within a deadline of its own (the upload may have used up its own)."""
    path = FILES + "/" + quote(file_id, safe="")
    headers = forward_headers([], identity.upstream_authorization, rid, True)
    deadline = time.perf_counter() + state.settings.upstream.total_timeout
    try:
        resp, _ = await state.gw.upstream.fetch("DELETE", state.gw.upstream.url_of(path), headers, deadline)
    except APIError as failure:
        log.warning("upload %s: could not delete file %s, whose owner could not be recorded: %s", rid,
                    file_id, failure.message)
        return
    if not 200 <= resp.status_code < 300:
        log.warning("upload %s: DeepSeek answered %d to deleting file %s, whose owner could not be recorded",
                    rid, resp.status_code, file_id)


async def _team_list(state: State, request: Request, owners: Owners, headers: list[tuple[bytes, bytes]],
                     deadline: float, done: OnEnd) -> Response:
    """DeepSeek's list narrowed to the caller's team's files, its next pages asked for while the team's
    page is not full (owners.py)."""
    rid, upstream = request_id_of(request), state.gw.upstream
    query = request.scope["query_string"].decode("latin-1")
    params = parse_qsl(query, keep_blank_values=True)
    cursor = after(params)
    try:
        if cursor is not None and not await owners.owns(cursor):
            done("refused", 404, NOT_OWNED)
            return error_response(no_such_file(cursor, "after"), rid)
        kept: list[dict[str, Any]] = []
        limit, asked = wanted(params), 0
        while True:
            resp, content = await upstream.fetch("GET", upstream.url_of(FILES, query), headers, deadline)
            asked += 1
            found = listing(content) if resp.status_code == 200 else None
            if found is None:
                return _relayed(resp, content, rid, done)
            page: list[dict[str, Any]] = found["data"]
            owned = await owners.owned([f["id"] for f in page])
            kept += [f for f in page if f["id"] in owned]
            more = found.get("has_more") is True
            if len(kept) >= limit or not more or not page or asked == MAX_LIST_PAGES:
                done("ok", 200, None)
                body = narrowed(found, kept[:limit], more or len(kept) > limit)
                return RawResponse(200, response_headers(resp.raw_headers, rid), body)
            query = next_query(params, page[-1]["id"])
    except APIError as error:
        done("upstream_failed" if error.status in (502, 504) else "aborted", error.status, error.code)
        return error_response(error, rid)


def _relayed(resp: Answer, content: bytes, rid: str, done: OnEnd) -> Response:
    """A list answer that is not a list (managed mode, a team's list): DeepSeek's error as it sent it, but its
    401 to chatgate's key (chatgate's 502); a 200 that is not a list is a 502 (relayed, it could show another
    team's files)."""
    if resp.status_code == 401:  # managed mode: chatgate's own key refused, never DeepSeek's text
        failure = upstream_auth_failed(rid)
        done("upstream_error", failure.status, failure.code)
        return error_response(failure, rid)
    if resp.status_code == 200:
        failure = bad_gateway("DeepSeek answered a file list with 200 but not a list of files (upstream "
                              "broke the protocol).", "upstream_bad_response")
        done("upstream_failed", failure.status, failure.code)
        return error_response(failure, rid)
    done("upstream_error", resp.status_code, None)
    return RawResponse(resp.status_code, response_headers(resp.raw_headers, rid), content)


def _left(deadline: float) -> float:
    return max(deadline - time.perf_counter(), 0.001)


def _failure(upload: Upload, exc: Exception) -> tuple[APIError, str]:
    """Why the exchange failed before DeepSeek answered, and its outcome: the upload went past the limit (the
    upstream request was aborted for it), or DeepSeek could not be reached or did not answer in time."""
    if upload.too_large or upload.too_slow:
        return upload.error(), "refused"
    return (exc if isinstance(exc, APIError) else map_transport_error(exc)), "upstream_failed"


def _upstream_path(route: str, request: Request) -> str:
    file_id = request.path_params.get("file_id")
    if file_id is None:
        return route
    if file_id in NOT_IDS:
        raise not_found(request.url.path)
    return route.replace("{file_id}", quote(file_id, safe=""))


def _has_body(request: Request) -> bool:
    length = request.headers.get("content-length")
    if length is not None:
        return length.isdigit() and int(length) > 0
    return "transfer-encoding" in request.headers


def _headers(request: Request, identity: Identity, request_id: str, managed: bool
             ) -> list[tuple[bytes, bytes]]:
    """The client's headers as every route forwards them; an upload keeps its Content-Length (it is relayed
    with the framing the client gave it)."""
    headers = forward_headers(request.headers.raw, identity.upstream_authorization, request_id, managed)
    length = request.headers.get("content-length")
    if length is not None and _has_body(request):
        headers.append((b"content-length", length.encode("latin-1")))
    return headers


def _note(ledger: Ledger, route: str, request_id: str, ts: float, t0: float, identity: Identity, method: str,
          outcome: str, status: int, code: str | None) -> None:
    ledger.note(route, request_id, status, outcome, ts, key_id=identity.key_id, method=method, code=code,
                latency_ms=round((time.perf_counter() - t0) * 1000, 3))
