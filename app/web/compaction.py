"""`/responses/compact` (and `/v1/responses/compact`), Codex's remote compaction: DeepSeek does not serve it,
so chatgate answers a 404 in the OpenAI shape that says how Codex compacts locally instead (whatever the
method, as for the FIM 404 in routes.py)."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from app.gateway.responses import error_response
from app.responses.family import COMPACT_PATHS, compaction_not_served

ANY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def add_compaction(app: FastAPI) -> None:
    for path in COMPACT_PATHS:
        app.router.add_route(path, _not_served, methods=ANY_METHOD, include_in_schema=False)


async def _not_served(request: Request) -> Response:
    return error_response(compaction_not_served(request.url.path))
