"""The app factory: `create_app(settings, transport=...)` wires the state, the routes and error handling."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

import httpx2
from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from chatgate import __version__
from chatgate.errors import APIError, not_found
from chatgate.gateway.bodies import request_id_of
from chatgate.gateway.http_limits import LimitsMiddleware, header_bytes, headers_too_large
from chatgate.gateway.proxy import Endpoint
from chatgate.gateway.responses import error_response
from chatgate.gateway.state import State
from chatgate.settings import Settings
from chatgate.store import Store
from chatgate.web.routes import add_routes

log = logging.getLogger("chatgate")


class ChatgateApp(FastAPI):
    """FastAPI serves every route, but the POSTs the gateway forwards (the hot path) skip its middleware
    stack: the gateway renders its own errors, and the header limit is checked here as LimitsMiddleware
    does for the other routes."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.state.chatgate.endpoints.get(scope["path"])
            if endpoint is not None:
                await self._forward(scope, receive, send, endpoint)
                return
        await super().__call__(scope, receive, send)

    async def _forward(self, scope: Scope, receive: Receive, send: Send, endpoint: Endpoint) -> None:
        state: State = self.state.chatgate
        limit = state.settings.limits.max_header_bytes
        if header_bytes(scope["headers"]) > limit:
            response = error_response(headers_too_large(limit), None, endpoint.family)
        else:
            try:
                response = await state.gw.handle(Request(scope, receive), endpoint)
            except Exception:
                log.exception("internal error on %s", scope["path"])
                response = error_response(INTERNAL_ERROR, None, endpoint.family)
        await response(scope, receive, send)


INTERNAL_ERROR = APIError(500, "chatgate hit an internal error; it has been logged.", "server_error", None,
                          "internal_error")


def create_app(settings: Settings | None = None, transport: httpx2.AsyncBaseTransport | None = None,
               store: Store | None = None, clock: Callable[[], float] = time.time) -> FastAPI:
    """`clock`: the time requests are recorded and priced at, and their limits counted by."""
    settings = settings or Settings()
    state = State(settings, transport, store, clock)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.start()
        try:
            yield
        finally:
            await state.stop()

    app = ChatgateApp(title="chatgate", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.chatgate = state
    # A trailing slash is a 404 in the route's shape, not Starlette's 307 whose Location is built from the
    # client's Host header.
    app.router.redirect_slashes = False
    add_routes(app, state)
    _add_error_handlers(app, state)
    app.add_middleware(LimitsMiddleware, max_header_bytes=settings.limits.max_header_bytes)
    return app


def _note_unmatched(request: Request, status: int) -> None:
    """A request for a route chatgate does not serve (Claude Code's `HEAD /anthropic` probe, a wrong base
    URL): counted under the route label "unmatched" (a bounded label, whatever the path) and access-logged
    with its method and path."""
    state: State = request.app.state.chatgate
    path = request.url.path
    state.gw.ledger.note("unmatched", request_id_of(request), status, "unmatched", time.time(),
                         method=request.method[:16], path=path if len(path) <= 200 else path[:200] + "…")


def _add_error_handlers(app: FastAPI, state: State) -> None:
    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        return error_response(exc)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code in (404, 405):
            _note_unmatched(request, exc.status_code)
        if exc.status_code == 404:
            return error_response(not_found(request.url.path), None, state.family_for(request.url.path))
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
