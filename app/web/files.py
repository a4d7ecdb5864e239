"""DeepSeek's Files API, `/files…` (also under `/v1`), passed through: an upload is streamed to DeepSeek as it
arrives (at most limits.max_file_bytes), DeepSeek's answer is relayed as it comes, errors included.

The caller is authenticated as on every route (managed: a missing, unknown or revoked key is a 401, and the
upstream key goes to DeepSeek; passthrough: the caller's own key goes through). Nothing is validated and
nothing is metered: there are no tokens, so no usage record and no quotas; each request gets an access-log
line and a count in /metrics under its route template (never a file id).
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from app.errors import APIError, not_found
from app.gateway.auth import Identity
from app.gateway.bodies import BodyStopped, Upload, request_id_of
from app.gateway.ledger import Ledger
from app.gateway.passthrough import Passthrough
from app.gateway.proxy import client_key
from app.gateway.responses import error_response
from app.gateway.state import State
from app.gateway.upstream import forward_headers, map_transport_error

FILES = "/files"
# (route template, the methods DeepSeek serves on it); each is also served under /v1
ROUTES: tuple[tuple[str, list[str]], ...] = (
    (FILES, ["GET", "POST"]),
    (FILES + "/{file_id}", ["GET", "DELETE"]),
    (FILES + "/{file_id}/content", ["GET"]),
)
NOT_IDS = frozenset({".", ".."})  # segments a URL resolves away: forwarded, they would reach another route
LIMIT_SETTING = "limits.max_file_bytes"


def add_files(app: FastAPI, state: State) -> None:
    for template, methods in ROUTES:
        handler = _handler(state, template)
        for prefix in ("", "/v1"):
            app.router.add_route(prefix + template, handler, methods=methods, include_in_schema=False)


def _handler(state: State, route: str) -> Any:
    async def files(request: Request) -> Response:
        gw, ts, t0, rid = state.gw, time.time(), time.perf_counter(), request_id_of(request)
        try:
            identity = await gw.auth.identify(client_key(request))
        except APIError as error:
            gw.ledger.refused(route, rid, error.status, error.code, ts)
            return error_response(error, rid)
        done = functools.partial(_note, gw.ledger, route, rid, ts, t0, identity, request.method)
        upload = Upload(request, state.settings.limits.max_file_bytes, LIMIT_SETTING)
        try:
            path = _upstream_path(route, request)
            upload.check()
        except APIError as error:
            done("refused", error.status, error.code)
            return error_response(error, rid)
        body = upload if _has_body(request) else None
        url = gw.upstream.url_of(path, request.scope["query_string"].decode("latin-1"))
        headers = _headers(request, identity, rid, gw.auth.managed)
        total = state.settings.upstream.total_timeout
        try:
            async with asyncio.timeout(total):
                resp = await gw.upstream.send(request.method, url, headers, body)
        except (APIError, BodyStopped, TimeoutError) as exc:
            if upload.client_gone:
                done("client_disconnected", 499, None)
                return Response(status_code=499)  # nobody reads it
            failure, outcome = _failure(upload, exc)
            done(outcome, failure.status, failure.code)
            return error_response(failure, rid)
        return Passthrough(resp, rid, t0 + total, done, watch=body is None or upload.done)
    return files


def _failure(upload: Upload, exc: Exception) -> tuple[APIError, str]:
    """Why the exchange failed before DeepSeek answered, and its outcome: the upload went past the limit (the
    upstream request was aborted for it), or DeepSeek could not be reached or did not answer in time."""
    if upload.too_large:
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
    with the framing the client gave it). `Expect` is not forwarded: chatgate has already answered it, and
    an upstream that never sends the 100 it asks for would stall the upload."""
    headers = [(k, v) for k, v in forward_headers(request.headers.raw, identity.upstream_authorization,
                                                  request_id, managed) if k.lower() != b"expect"]
    length = request.headers.get("content-length")
    if length is not None and _has_body(request):
        headers.append((b"content-length", length.encode("latin-1")))
    return headers


def _note(ledger: Ledger, route: str, request_id: str, ts: float, t0: float, identity: Identity, method: str,
          outcome: str, status: int, code: str | None) -> None:
    ledger.note(route, request_id, status, outcome, ts, key_id=identity.key_id, method=method, code=code,
                latency_ms=round((time.perf_counter() - t0) * 1000, 3))
