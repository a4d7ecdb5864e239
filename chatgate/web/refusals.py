"""The refusal inspector over HTTP (admin key only): `GET /admin/refusals[?team=&key=&rule=&since=&limit=
&cursor=]` (newest first, without bodies, a page at a time: `next_cursor`) and `GET /admin/refusals/{id}[?fix=
true&key=&team=]` by refusal id or request id (the redacted body, marked with its problems, and what
`chatgate lint --fix` would repair; a request id several keys' refusals carry is a 409 listing them)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from chatgate.errors import APIError
from chatgate.gateway.auth import address_of, require_admin
from chatgate.gateway.responses import json_response
from chatgate.metering.reports import ReportError, parse_time
from chatgate.refusals.service import Ambiguous, list_refusals, show_refusal
from chatgate.refusals.store import LIST_MAX, RefusalQuery, RefusalStore, parse_cursor
from chatgate.refusals.view import Checker

if TYPE_CHECKING:
    from chatgate.gateway.state import State

NO_STORE = {"cache-control": "no-store"}


def add_refusals(app: FastAPI, state: State) -> None:
    def store_of(request: Request) -> RefusalStore:
        require_admin(state.gw.auth, request.headers.get("authorization"), address_of(request))
        if state.refusals is None:
            raise APIError(503, "The refusal inspector is off: it needs a store (store.url) and "
                           "server.capture_refusals > 0.", "server_error", None, "refusals_off")
        return state.refusals.store

    def family_of(route: str) -> tuple[Checker, bool] | None:
        endpoint = state.endpoints.get(route)
        return (endpoint.family, endpoint.route.beta) if endpoint is not None else None

    async def listing(request: Request) -> Response:
        store = store_of(request)
        q = request.query_params
        try:
            since = parse_time(q.get("since"), "since")
            limit = int(q.get("limit", "100"))
            after = parse_cursor(q["cursor"]) if q.get("cursor") else None
            if not 1 <= limit <= LIST_MAX:
                raise ValueError(f"limit must be 1 to {LIST_MAX}")
        except (ReportError, ValueError) as exc:
            raise APIError(400, f"Invalid query: {exc}", "invalid_request_error", None,
                           "invalid_value") from None
        query = RefusalQuery(q.get("team"), q.get("key"), q.get("rule"), since, limit, after)
        rows, cursor = await asyncio.to_thread(list_refusals, store, query,
                                               state.settings.server.refusal_ttl_hours)
        page = {"object": "list", "data": rows, "has_more": cursor is not None, "next_cursor": cursor}
        return json_response(200, page, NO_STORE)

    async def one(request: Request) -> Response:
        store = store_of(request)
        fix = request.query_params.get("fix", "").lower() in ("1", "true", "yes")
        q = request.query_params
        try:
            found = await asyncio.to_thread(
                show_refusal, store, request.path_params["request_id"],
                state.settings.server.refusal_ttl_hours, family_of if fix else None,
                state.settings.repair.options() if fix else None, q.get("key"), q.get("team"))
        except Ambiguous as many:
            return json_response(409, {"error": {
                "message": "Refusals of several keys carry this request id (clients choose their own "
                           "x-request-id): ask for one by its refusal_id, or narrow with ?key= or ?team=.",
                "type": "invalid_request_error", "param": None, "code": "ambiguous_request_id"},
                "candidates": many.candidates}, NO_STORE)
        if found is None:
            raise APIError(404, "No refusal kept with this request id (kept: the last "
                           f"{state.settings.server.capture_refusals} per process, for "
                           f"{state.settings.server.refusal_ttl_hours:g} h).", "invalid_request_error", None,
                           "refusal_not_found")
        return json_response(200, found, NO_STORE)

    app.router.add_route("/admin/refusals", listing, methods=["GET"], include_in_schema=False)
    app.router.add_route("/admin/refusals/{request_id}", one, methods=["GET"], include_in_schema=False)
