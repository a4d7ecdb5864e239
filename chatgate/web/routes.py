"""Every route but the forwarded POSTs: models, the account balance, the Files API (chatgate/files/), health,
readiness, metrics, the admin usage report, and the routes each family declares besides its forwarded ones
(the paths DeepSeek does not serve, answered with the family's error; chatgate's own token counts)."""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from chatgate import __version__
from chatgate.errors import APIError, bad_gateway, upstream_auth_failed
from chatgate.files.routes import add_files
from chatgate.gateway.auth import Authenticator, address_of, bearer, client_key, hash_key, require_admin
from chatgate.gateway.bodies import origin_of, request_id_of
from chatgate.gateway.proxy import Endpoint
from chatgate.gateway.responses import JSON, RawResponse, error_response, json_response
from chatgate.gateway.state import State
from chatgate.gateway.upstream import Answer, response_headers
from chatgate.metering.cache_report import build_cache_report, cache_query
from chatgate.metering.reports import ReportError, build_report, make_query
from chatgate.web.admin import add_admin
from chatgate.web.count_tokens import add_count_tokens
from chatgate.web.dashboard import add_dashboard
from chatgate.web.refusals import add_refusals
from chatgate.web.rules import add_rules
from chatgate.web.runs import add_runs

BALANCE_ROUTE = "/user/balance"
MODELS_CACHE_SLOTS = 1024
ANY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


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
    app.router.add_route("/admin/cache", _admin_cache_handler(state), methods=["GET"],
                         include_in_schema=False)
    for path in (BALANCE_ROUTE, "/v1" + BALANCE_ROUTE):
        app.router.add_route(path, _balance_handler(state), methods=["GET"], include_in_schema=False)
    add_files(app, state)
    families = list(dict.fromkeys(e.family for e in state.endpoints.values()))  # each once, in order
    for family in families:  # FIM's /v1/completions, Responses' /compact: a 404 that says why, any method
        for path, error in family.not_served:
            app.router.add_route(path, _not_served(error), methods=ANY_METHOD, include_in_schema=False)
    add_count_tokens(app, state, families)
    add_runs(app, state)
    add_dashboard(app, state)
    add_admin(app, state)
    add_refusals(app, state)
    add_rules(app, state)


async def _healthz(request: Request) -> Response:
    return json_response(200, {"status": "ok", "version": __version__})


def _readyz_handler(state: State) -> Any:
    async def readyz(request: Request) -> Response:
        try:
            problems = await asyncio.wait_for(asyncio.to_thread(state.readiness_problems), 5.0)
        except TimeoutError:
            problems = ["usage store did not answer within 5 s"]
        body: dict[str, Any] = {"ready": not problems, "problems": problems,
                                "spooled_records": state.recorder.pending if state.recorder else 0}
        if state.gateway is not None and state.gateway.pool is not None:
            body["accounts"] = state.gateway.pool.states()
        return json_response(200 if not problems else 503, body)
    return readyz


def _metrics_handler(state: State) -> Any:
    """Prometheus' scrape. /metrics shows every team's spend: with server.metrics_token set it needs
    `Authorization: Bearer <token>` (Prometheus' `authorization` / `bearer_token_file`), else it is open."""
    token = state.settings.server.metrics_token

    async def metrics(request: Request) -> Response:
        if token is not None and not _token_matches(request, token.get_secret_value()):
            return error_response(APIError(
                401, "/metrics needs 'Authorization: Bearer <server.metrics_token>'.", "authentication_error",
                None, "invalid_metrics_token", headers={"www-authenticate": "Bearer"}))
        return Response(state.metrics.render(), 200, media_type="text/plain; version=0.0.4; charset=utf-8")
    return metrics


def _token_matches(request: Request, expected: str) -> bool:
    given = bearer(request.headers.get("authorization"))
    return given is not None and hmac.compare_digest(given.encode("utf-8", "surrogateescape"),
                                                     expected.encode())


def _models_handler(state: State) -> Any:
    """DeepSeek's `GET /models`, asked with the caller's upstream key and relayed as it answers, errors
    included. The caller is authenticated first (managed: a missing, unknown or revoked key is a 401). A 200
    is cached per upstream key for upstream.models_cache_seconds; chatgate's configured models answer only
    when DeepSeek cannot be reached."""
    async def models(request: Request) -> Response:
        rid = request_id_of(request)
        try:
            identity = await state.gw.auth.identify_request(request)
        except APIError as error:
            return error_response(error, rid)
        authorization = identity.upstream_authorization
        slot = hash_key(authorization or "")
        cached = state.models_cache.get(slot)
        if cached is not None and cached[0] > time.monotonic():
            return Response(cached[1], 200, headers={"x-request-id": rid}, media_type=JSON)
        try:
            resp, content = await _get_upstream(state, "/models", rid, authorization)
        except APIError:
            return _configured_models(state, rid)
        if resp.status_code == 401 and state.gw.auth.managed:  # chatgate's own key: never DeepSeek's text
            return error_response(upstream_auth_failed(rid), rid)
        if resp.status_code == 200:
            if not _is_json(content):
                return error_response(bad_gateway("DeepSeek answered /models with 200 but a body that is not "
                                                  "JSON (upstream broke the protocol).",
                                                  "upstream_bad_response"), rid)
            _cache_models(state, slot, content)
        return RawResponse(resp.status_code, response_headers(resp.raw_headers, rid), content)
    return models


def _configured_models(state: State, request_id: str) -> Response:
    listing = [{"id": name, "object": "model", "owned_by": "deepseek"} for name in state.gw.profiles]
    return json_response(200, {"object": "list", "data": listing, "source": "chatgate"},
                         {"x-request-id": request_id})


def _cache_models(state: State, slot: str, content: bytes) -> None:
    ttl = state.settings.upstream.models_cache_seconds
    if ttl <= 0:
        return
    if len(state.models_cache) >= MODELS_CACHE_SLOTS:  # passthrough: one slot per client key
        state.models_cache.clear()
    state.models_cache[slot] = (time.monotonic() + ttl, content)


def _is_json(content: bytes) -> bool:
    try:
        orjson.loads(content)
    except orjson.JSONDecodeError:
        return False
    return True


async def _get_upstream(state: State, path: str, request_id: str, authorization: str | None
                        ) -> tuple[Answer, bytes]:
    """DeepSeek's answer to a GET and its whole body, read within upstream.total_timeout; the APIError
    (502, 504) when DeepSeek cannot be reached or does not answer in time."""
    headers = [("x-request-id", request_id), ("accept-encoding", "identity"),
               *([("authorization", authorization)] if authorization else [])]
    deadline = time.perf_counter() + state.settings.upstream.total_timeout
    return await state.gw.upstream.fetch("GET", path, headers, deadline)


def _not_served(error: Callable[[str, str | None], APIError]) -> Any:
    async def not_served(request: Request) -> Response:
        return error_response(error(request.url.path, origin_of(request)))
    return not_served


def _balance_handler(state: State) -> Any:
    """DeepSeek's `GET /user/balance`, relayed as it answers. Passthrough: asked with the caller's own key.
    Managed: it is the whole account's balance, so only the admin key gets it (asked with the upstream key);
    a client key is a 403, a missing or unknown key a 401. Access-logged and counted, never metered."""
    async def balance(request: Request) -> Response:
        gw, t0, ts, rid = state.gw, time.perf_counter(), time.time(), request_id_of(request)
        try:
            key_id, authorization = await _balance_caller(gw.auth, client_key(request.headers))
        except APIError as error:
            gw.ledger.refused(BALANCE_ROUTE, rid, error.status, error.code, ts)
            return error_response(error, rid)
        try:
            resp, content = await _get_upstream(state, BALANCE_ROUTE, rid, authorization)
        except APIError as error:
            _log_balance(state, rid, ts, t0, error.status, "upstream_failed", error.code, key_id)
            return error_response(error, rid)
        outcome = "ok" if resp.status_code == 200 else "upstream_error"
        _log_balance(state, rid, ts, t0, resp.status_code, outcome, None, key_id)
        return RawResponse(resp.status_code, response_headers(resp.raw_headers, rid), content)
    return balance


async def _balance_caller(auth: Authenticator, authorization: str | None) -> tuple[str, str | None]:
    """(who, the Authorization to send DeepSeek) for a balance request, or the APIError refusing it."""
    if not auth.managed:
        identity = await auth.identify(authorization)
        return identity.key_id, identity.upstream_authorization
    if auth.is_admin(authorization):
        upstream = auth.settings.upstream_api_key
        if upstream is None:
            raise APIError(503, "Managed mode has no upstream key to ask DeepSeek for the balance: set "
                           "DEEPSEEK_API_KEY.", "server_error", None, "no_upstream_key")
        return "admin", f"Bearer {upstream.get_secret_value()}"
    await auth.identify(authorization)  # a missing, unknown or revoked key: its 401
    raise APIError(403, "The balance is the whole DeepSeek account's: only the admin key "
                   "(CHATGATE_ADMIN_KEY) may read it in managed mode; client keys are refused.",
                   "permission_error", None, "admin_key_required")


def _log_balance(state: State, request_id: str, ts: float, t0: float, status: int, outcome: str,
                 code: str | None, key_id: str) -> None:
    """A forwarded balance request: its access-log line and its count in /metrics (no usage record)."""
    ledger = state.gw.ledger
    ledger.metrics.observe_status(BALANCE_ROUTE, status)
    if ledger.access_log is not None:
        ledger.access_log.write({
            "event": "request", "ts": ts, "request_id": request_id, "route": BALANCE_ROUTE, "key_id": key_id,
            "status": status, "outcome": outcome, "code": code,
            "latency_ms": round((time.perf_counter() - t0) * 1000, 3)})


def _admin_cache_handler(state: State) -> Any:
    async def admin_cache(request: Request) -> Response:
        require_admin(state.gw.auth, request.headers.get("authorization"), address_of(request))
        if state.store is None:
            raise APIError(503, "Metering is off (store.url = none).", "server_error", None, "no_store")
        q = request.query_params
        try:
            by, since, until = cache_query(q.get("by") or "key", q.get("since"), q.get("until"))
        except ReportError as exc:
            raise APIError(400, str(exc), "invalid_request_error", "by", "invalid_value") from None
        report = await asyncio.to_thread(build_cache_report, state.store, by, since, until, state.currency)
        return json_response(200, report, {"cache-control": "no-store"})
    return admin_cache


def _admin_usage_handler(state: State) -> Any:
    async def admin_usage(request: Request) -> Response:
        require_admin(state.gw.auth, request.headers.get("authorization"), address_of(request))
        if state.store is None:
            raise APIError(503, "Metering is off (store.url = none).", "server_error", None, "no_store")
        q = request.query_params
        try:
            query = make_query(q.get("by") or q.get("group_by") or "team", q.get("since"), q.get("until"),
                               q.get("team"), q.get("key"))
        except ReportError as exc:
            raise APIError(400, str(exc), "invalid_request_error", "by", "invalid_value") from None
        store = state.store
        report = await asyncio.to_thread(build_report, store, query, state.currency)
        return json_response(200, report)
    return admin_usage
