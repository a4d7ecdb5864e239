"""The rules' evidence over HTTP (admin key only): `GET /admin/rules[?family=&since=]`, the JSON of `chatgate
rules --format json` (docs/confirmation.md)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from chatgate.confirmation.service import rules_report
from chatgate.errors import APIError
from chatgate.gateway.auth import address_of, require_admin
from chatgate.gateway.responses import json_response
from chatgate.metering.reports import ReportError, parse_time

if TYPE_CHECKING:
    from chatgate.gateway.state import State

NO_STORE = {"cache-control": "no-store"}


def add_rules(app: FastAPI, state: State) -> None:
    async def report(request: Request) -> Response:
        require_admin(state.gw.auth, request.headers.get("authorization"), address_of(request))
        if state.store is None:
            raise APIError(503, "The rules' evidence needs a store (store.url).", "server_error", None,
                           "store_off")
        q = request.query_params
        try:
            since = parse_time(q.get("since"), "since")
        except ReportError as exc:
            raise APIError(400, f"Invalid query: {exc}", "invalid_request_error", "since",
                           "invalid_value") from None
        if state.gw.confirmations is not None:  # this replica's latest scores too
            await state.gw.confirmations.flush()
        found = await asyncio.to_thread(rules_report, state.store, q.get("family"), since)
        return json_response(200, found, NO_STORE)

    app.router.add_route("/admin/rules", report, methods=["GET"], include_in_schema=False)
