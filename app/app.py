"""The app factory: `create_app(settings, transport=...)` wires store, recorder, upstream and routes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import orjson
from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app import __version__
from app.auth import Authenticator
from app.errors import APIError, not_found
from app.limits import LimitsMiddleware, header_bytes, headers_too_large
from app.metrics import Metrics
from app.proxy import CHAT_ROUTES, Gateway, error_response, json_response
from app.recorder import Recorder
from app.reports import ReportError, build_report, make_query
from app.settings import Settings
from app.store import Store, open_store
from app.upstream import Upstream

log = logging.getLogger("chatgate")


class State:
    """What the routes share; one per app."""

    def __init__(self, settings: Settings, transport: httpx2.AsyncBaseTransport | None,
                 store: Store | None) -> None:
        self.settings = settings
        self.transport = transport
        self.store = store
        self.metrics = Metrics(settings.profiles())
        self.recorder: Recorder | None = None
        self.gateway: Gateway | None = None
        self.models_cache: tuple[float, bytes] | None = None

    @property
    def gw(self) -> Gateway:
        assert self.gateway is not None, "the app has not started"
        return self.gateway

    async def start(self) -> None:
        s = self.settings
        if self.store is None and s.store.enabled:
            self.store = await asyncio.to_thread(open_store, s.store.url)
        if self.store is not None:
            await asyncio.to_thread(self.store.migrate)
            self.recorder = Recorder(self.store, s.store.spool_dir, s.store.batch_max,
                                     s.store.flush_interval_ms / 1000, s.store.retry_seconds)
            self.recorder.start()
        upstream = Upstream(s.upstream, self.transport)
        self.gateway = Gateway(s, upstream, self.recorder, Authenticator(s.auth, self.store), self.metrics)

    async def stop(self) -> None:
        if self.gateway is not None:
            await self.gateway.drain()
            await self.gateway.upstream.aclose()
        if self.recorder is not None:
            flushed = await asyncio.to_thread(self.recorder.stop, 30.0)
            if not flushed:
                log.warning("%d usage record(s) left in the spool; they are written on the next start",
                            self.recorder.pending)
        if self.store is not None:
            await asyncio.to_thread(self.store.close)


class ChatgateApp(FastAPI):
    """FastAPI serves every route, but the chat-completions POSTs (the hot path) skip its middleware
    stack: the gateway renders its own errors, and the header limit is checked here as LimitsMiddleware
    does for the other routes."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in CHAT_ROUTES:
            await self._chat(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        state: State = self.state.chatgate
        limit = state.settings.limits.max_header_bytes
        if header_bytes(scope["headers"]) > limit:
            response = error_response(headers_too_large(limit))
        else:
            try:
                response = await state.gw.chat(Request(scope, receive))
            except Exception:
                log.exception("internal error on %s", scope["path"])
                response = error_response(INTERNAL_ERROR)
        await response(scope, receive, send)


INTERNAL_ERROR = APIError(500, "chatgate hit an internal error; it has been logged.", "server_error", None,
                          "internal_error")


def create_app(settings: Settings | None = None, transport: httpx2.AsyncBaseTransport | None = None,
               store: Store | None = None) -> FastAPI:
    settings = settings or Settings()
    state = State(settings, transport, store)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.start()
        try:
            yield
        finally:
            await state.stop()

    app = ChatgateApp(title="chatgate", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.chatgate = state
    _add_routes(app, state)
    _add_error_handlers(app)
    app.add_middleware(LimitsMiddleware, max_header_bytes=settings.limits.max_header_bytes)
    return app


def _add_routes(app: FastAPI, state: State) -> None:
    async def chat(request: Request) -> Response:
        return await state.gw.chat(request)

    async def validate(request: Request) -> Response:
        return await state.gw.validate_only(request)

    for path in CHAT_ROUTES:
        app.router.add_route(path, chat, methods=["POST"], include_in_schema=False)
    for path in ("/v1/chat/completions/validate", "/chat/completions/validate"):
        app.router.add_route(path, validate, methods=["POST"], include_in_schema=False)
    for path in ("/v1/models", "/models"):
        app.router.add_route(path, _models_handler(state), methods=["GET"], include_in_schema=False)
    app.router.add_route("/healthz", _healthz, methods=["GET"], include_in_schema=False)
    app.router.add_route("/readyz", _readyz_handler(state), methods=["GET"], include_in_schema=False)
    app.router.add_route("/metrics", _metrics_handler(state), methods=["GET"], include_in_schema=False)
    app.router.add_route("/admin/usage", _admin_usage_handler(state), methods=["GET"],
                         include_in_schema=False)
    from app.dashboard import add_dashboard

    add_dashboard(app, state)


async def _healthz(request: Request) -> Response:
    return json_response(200, {"status": "ok", "version": __version__})


def _readyz_handler(state: State) -> Any:
    async def readyz(request: Request) -> Response:
        try:
            problems = await asyncio.wait_for(asyncio.to_thread(readiness_problems, state), 5.0)
        except TimeoutError:
            problems = ["usage store did not answer within 5 s"]
        body = {"ready": not problems, "problems": problems,
                "spooled_records": state.recorder.pending if state.recorder else 0}
        return json_response(200 if not problems else 503, body)
    return readyz


def readiness_problems(state: State) -> list[str]:
    problems = []
    if state.store is not None:
        try:
            state.store.ping()
        except Exception as exc:
            problems.append(f"usage store not writable: {type(exc).__name__}")
    if state.recorder is not None and not state.recorder.healthy:
        problems.append(state.recorder.last_error or "usage writer failing")
    auth = state.settings.auth
    if auth.mode == "managed" and auth.upstream_api_key is None:
        problems.append("auth.mode is managed but DEEPSEEK_API_KEY is not set")
    return problems


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
        require_admin(state, request)
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


def require_admin(state: State, request: Request) -> None:
    if not state.gw.auth.is_admin(request.headers.get("authorization")):
        raise APIError(401, "Admin routes need 'Authorization: Bearer <CHATGATE_ADMIN_KEY>'; client keys are "
                       "refused.", "authentication_error", None, "invalid_admin_key",
                       headers={"www-authenticate": "Bearer"})


def _add_error_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        return error_response(exc)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            return error_response(not_found(request.url.path))
        if exc.status_code == 405:
            message = f"Method {request.method} is not allowed on {request.url.path}."
            return error_response(APIError(405, message,
                                           "invalid_request_error", None, "method_not_allowed"))
        return error_response(APIError(exc.status_code, str(exc.detail), "invalid_request_error", None, None))

    async def on_crash(request: Request, exc: Exception) -> Response:
        log.exception("internal error on %s", request.url.path)
        return error_response(INTERNAL_ERROR)

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(Exception, on_crash)
