"""`POST /anthropic/v1/messages/count_tokens`: answered by chatgate itself with DeepSeek's V4 tokenizer
(DeepSeek documents no such route). Authenticated like the messages route; nothing is forwarded or billed."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from app.anthropic.family import prompt_text
from app.errors import APIError
from app.gateway.bodies import read_json_body, request_id_of
from app.gateway.responses import error_response, json_response
from app.gateway.state import State
from app.metering.tokens import count_text

PATHS = ("/anthropic/v1/messages/count_tokens", "/anthropic/messages/count_tokens")
LABEL = "/anthropic/v1/messages/count_tokens"


def add_count_tokens(app: FastAPI, state: State) -> None:
    family = state.endpoints["/anthropic/v1/messages"].family

    async def count_tokens(request: Request) -> Response:
        request_id = request_id_of(request)
        gw = state.gw
        try:
            await gw.auth.identify_request(request)
            body = await read_json_body(request, state.settings.limits.max_body_bytes,
                                        state.settings.limits.body_timeout_seconds)
            data = orjson.loads(body)
            if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
                raise APIError(400, "count_tokens needs a JSON object with 'model' and 'messages', as for "
                               "/anthropic/v1/messages.", "invalid_request_error", "messages",
                               "missing_required_parameter")
        except orjson.JSONDecodeError:
            error = APIError(400, "Request body is not valid JSON.", "invalid_request_error", None,
                             "invalid_json")
            return _refused(state, error, request_id, family)
        except APIError as error:
            return _refused(state, error, request_id, family)
        tokens = await asyncio.to_thread(count_text, prompt_text(data))
        gw.ledger.note(LABEL, request_id, 200, "counted", time.time(), input_tokens=tokens)
        return json_response(200, {"input_tokens": tokens}, {"x-request-id": request_id})

    for path in PATHS:
        app.router.add_route(path, count_tokens, methods=["POST"], include_in_schema=False)


def _refused(state: State, error: APIError, request_id: str, family: Any) -> Response:
    state.gw.ledger.refused(LABEL, request_id, error.status, error.code, time.time())
    return error_response(error, request_id, family)
