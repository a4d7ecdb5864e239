"""Every route but chat completions: models, health, readiness, metrics, the admin usage report."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx2
import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from app import __version__
from app.errors import APIError
from app.gateway.auth import require_admin
from app.gateway.proxy import Endpoint
from app.gateway.responses import json_response
from app.gateway.state import State
from app.metering.reports import ReportError, build_report, make_query
from app.web.dashboard import add_dashboard


def add_routes(app: FastAPI, state: State) -> None:
    def forward(endpoint: Endpoint) -> Any:
        async def handler(request: Request) -> Response:
            return await state.gw.handle(request, endpoint)
        return handler

    def dry_run(endpoint: Endpoint) -> Any:
        async def handler(request: Request) -> Response:
            return await state.gw.validate_only(request, endpoint)
        return handler

    # ChatgateApp answers these POSTs before routing; registered too so that other methods get a 405.
    for path, endpoint in state.endpoints.items():
        app.router.add_route(path, forward(endpoint), methods=["POST"], include_in_schema=False)
    for path, endpoint in state.dry_runs.items():
        app.router.add_route(path, dry_run(endpoint), methods=["POST"], include_in_schema=False)
    for path in ("/v1/models", "/models"):
        app.router.add_route(path, _models_handler(state), methods=["GET"], include_in_schema=False)
    app.router.add_route("/healthz", _healthz, methods=["GET"], include_in_schema=False)
    app.router.add_route("/readyz", _readyz_handler(state), methods=["GET"], include_in_schema=False)
    app.router.add_route("/metrics", _metrics_handler(state), methods=["GET"], include_in_schema=False)
    app.router.add_route("/admin/usage", _admin_usage_handler(state), methods=["GET"],
                         include_in_schema=False)
    add_dashboard(app, state)


async def _healthz(request: Request) -> Response:
    return json_response(200, {"status": "ok", "version": __version__})


def _readyz_handler(state: State) -> Any:
    async def readyz(request: Request) -> Response:
        try:
            problems = await asyncio.wait_for(asyncio.to_thread(state.readiness_problems), 5.0)
        except TimeoutError:
            problems = ["usage store did not answer within 5 s"]
        body = {"ready": not problems, "problems": problems,
                "spooled_records": state.recorder.pending if state.recorder else 0}
        return json_response(200 if not problems else 503, body)
    return readyz


def _metrics_handler(state: State) -> Any:
    async def metrics(request: Request) -> Response:
        return Response(state.metrics.render(), 200, media_type="text/plain; version=0.0.4; charset=utf-8")
    return metrics


def _models_handler(state: State) -> Any:
    async def models(request: Request) -> Response:
        ttl = state.settings.upstream.models_cache_seconds
        cached = state.models_cache
        if cached is not None and cached[0] > time.monotonic():
            return Response(cached[1], 200, media_type="application/json")
        body = await _fetch_models(state, request)
        if body is None:
            listing = [{"id": name, "object": "model", "owned_by": "deepseek"} for name in state.gw.profiles]
            return json_response(200, {"object": "list", "data": listing, "source": "chatgate"})
        state.models_cache = (time.monotonic() + ttl, body)
        return Response(body, 200, media_type="application/json")
    return models


async def _fetch_models(state: State, request: Request) -> bytes | None:
    gw = state.gw
    try:
        identity = await gw.auth.identify(request.headers.get("authorization"))
    except APIError:
        return None
    headers = [("authorization", identity.upstream_authorization)] if identity.upstream_authorization else []
    try:
        resp = await gw.upstream.send("GET", "/models", headers, None)
        content = await resp.aread()
        await resp.aclose()
    except (APIError, httpx2.TransportError, OSError):
        return None
    if resp.status_code != 200:
        return None
    try:
        orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    return content


def _admin_usage_handler(state: State) -> Any:
    async def admin_usage(request: Request) -> Response:
        require_admin(state.gw.auth, request.headers.get("authorization"))
        if state.store is None:
            raise APIError(503, "Metering is off (store.url = none).", "server_error", None, "no_store")
        q = request.query_params
        try:
            query = make_query(q.get("by") or q.get("group_by") or "team", q.get("since"), q.get("until"))
        except ReportError as exc:
            raise APIError(400, str(exc), "invalid_request_error", "by", "invalid_value") from None
        store = state.store
        report = await asyncio.to_thread(build_report, store, query)
        return json_response(200, report)
    return admin_usage
