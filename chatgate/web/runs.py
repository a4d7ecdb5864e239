"""Agent runs over HTTP (admin key only): `GET /admin/runs[?team=&key=&since=&limit=]` (the runs with a
request since `since`, default the last 7 days, latest begun first: `{"runs": [...]}`, each with its context
per request for a chart), `GET /admin/runs/{run_id}` (one run request by request), and the dashboard's Runs
card script (`/admin/dashboard/runs.js`)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from chatgate.errors import APIError
from chatgate.gateway.auth import address_of, require_admin
from chatgate.gateway.responses import json_response
from chatgate.metering.reports import ReportError, parse_time
from chatgate.runs import reading
from chatgate.runs.summary import runs_document, show

if TYPE_CHECKING:
    from chatgate.gateway.state import State

NO_STORE = {"cache-control": "no-store"}
WEEK = 7 * 86400
SCRIPT = Path(__file__).resolve().parent / "static" / "runs.js"


async def caught_up(state: State) -> None:
    """The records of the requests answered so far in the store: a run just seen is listed whole."""
    if state.recorder is not None:
        await state.recorder.caught_up()


def add_runs(app: FastAPI, state: State) -> None:
    def admitted(request: Request) -> None:
        require_admin(state.gw.auth, request.headers.get("authorization"), address_of(request))
        if state.store is None:
            raise APIError(503, "Metering is off (store.url = none): runs are kept in the store.",
                           "server_error", None, "no_store")

    async def runs(request: Request) -> Response:
        admitted(request)
        q = request.query_params
        try:
            since = parse_time(q.get("since"), "since")
        except ReportError as exc:
            raise APIError(400, str(exc), "invalid_request_error", "since", "invalid_value") from None
        limit = q.get("limit") or "200"
        if not limit.isdigit() or not 1 <= int(limit) <= 1000:
            raise APIError(400, f"Invalid value for 'limit': expected 1 to 1000, got {limit!r}.",
                           "invalid_request_error", "limit", "invalid_value")
        start = time.time() - WEEK if since is None else since
        store = state.store
        assert store is not None  # (admitted)
        await caught_up(state)
        found = await asyncio.to_thread(reading.find, store, q.get("team"), q.get("key"), start, int(limit))
        return json_response(200, runs_document(found), NO_STORE)

    async def run(request: Request) -> Response:
        admitted(request)
        run_id = request.path_params["run_id"]
        store = state.store
        assert store is not None  # (admitted)
        await caught_up(state)
        found = await asyncio.to_thread(show, store, run_id)
        if found is None:
            raise APIError(404, f"No run {run_id!r} (nor one run whose id starts with it).",
                           "invalid_request_error", "run_id", "run_not_found")
        return json_response(200, found, NO_STORE)

    async def script(request: Request) -> Response:
        return Response(SCRIPT.read_bytes(), media_type="text/javascript; charset=utf-8", headers=NO_STORE)

    router = app.router
    router.add_route("/admin/runs", runs, methods=["GET"], include_in_schema=False)
    router.add_route("/admin/runs/{run_id}", run, methods=["GET"], include_in_schema=False)
    router.add_route("/admin/dashboard/runs.js", script, methods=["GET"], include_in_schema=False)
