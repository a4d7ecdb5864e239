"""`POST /anthropic/v1/messages/count_tokens`: answered by chatgate itself with DeepSeek's V4 tokenizer
(DeepSeek documents no such route). Authenticated and rate-limited like the messages route (a count takes
one request of the key's rpm and a concurrency slot, no tokens); nothing is forwarded or billed.

What one count may cost is bounded: the body by limits.max_body_bytes (413), the exact count by
limits.count_tokens_exact_bytes of prompt text. Above that, the answer is an upper bound (the text's UTF-8
bytes: every token covers at least one byte), said so in `x-chatgate-warning`; it is taken where the body
is read (a checker process for a large one), so that the text does not come back to the server. An exact
count runs on the tokenizer's worker thread with the interpreter lock released (app/metering/tokens.py):
other requests go on.
"""

from __future__ import annotations

import functools
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
from app.gateway.strict import body_problem
from app.metering.tokens import count_async, count_text
from app.quotas.admission import limit_error
from app.quotas.model import Admission, Refusal
from app.wire import taken

PATHS = ("/anthropic/v1/messages/count_tokens", "/anthropic/messages/count_tokens")
LABEL = "/anthropic/v1/messages/count_tokens"


def add_count_tokens(app: FastAPI, state: State) -> None:
    family = state.endpoints["/anthropic/v1/messages"].family

    async def count_tokens(request: Request) -> Response:
        request_id, ts = request_id_of(request), time.time()
        gw, limits = state.gw, state.settings.limits
        try:
            identity = await gw.auth.identify_request(request)
            body = await read_json_body(request, limits.max_body_bytes, limits.body_timeout_seconds)
            exact_bytes = limits.count_tokens_exact_bytes
            text = await gw.checkers.run(len(body), functools.partial(_prompt_of, body, exact_bytes))
        except APIError as error:
            return _refused(state, error, request_id, family)
        admission: Admission | None = None
        if gw.quotas is not None:
            admitted = await gw.quotas.admit(identity.team, identity.key_id, lambda at: (0, 0), started_at=ts)
            if isinstance(admitted, Refusal):
                limited = limit_error(admitted)
                gw.metrics.limited.labels(admitted.code).inc()
                return _refused(state, limited, request_id, family)
            admission = admitted
        try:
            tokens, exact = (text, False) if isinstance(text, int) else \
                (await count_async(functools.partial(count_text, text)), True)
        finally:
            if admission is not None and gw.quotas is not None:
                await gw.quotas.settle(admission, 0, 0)
        headers = {"x-request-id": request_id}
        if not exact:
            headers["x-chatgate-warning"] = (
                f"input_tokens is an upper bound (the prompt's UTF-8 bytes): its text is over "
                f"{limits.count_tokens_exact_bytes} bytes (limits.count_tokens_exact_bytes)")
        gw.ledger.note(LABEL, request_id, 200, "counted", ts, input_tokens=tokens, exact=exact)
        return json_response(200, {"input_tokens": tokens}, headers)

    for path in PATHS:
        app.router.add_route(path, count_tokens, methods=["POST"], include_in_schema=False)


def _prompt_of(body: bytes, exact_bytes: int) -> str | int:
    """The text to count (in a checker process for a large body), or the refusal. Above `exact_bytes` of
    text, its UTF-8 bytes instead: the upper bound answered (every token covers at least one byte), and the
    text never crosses the pipe back (a 40 MB prompt grew the server by 150 MB, kept after the count)."""
    strict = body_problem(body)
    if strict is not None:
        raise APIError.from_problems([strict])
    data = taken(body)  # R1's parse (it read the body whole), taken: a thread does not keep it
    if data is None:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise APIError(400, "Request body is not valid JSON.", "invalid_request_error", None,
                           "invalid_json") from None
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise APIError(400, "count_tokens needs a JSON object with 'model' and 'messages', as for "
                       "/anthropic/v1/messages.", "invalid_request_error", "messages",
                       "missing_required_parameter")
    text = prompt_text(data)
    if len(text) * 4 <= exact_bytes:  # UTF-8 takes at most 4 bytes a character
        return text
    size = len(text.encode("utf-8", "surrogatepass"))
    return size if size > exact_bytes else text


def _refused(state: State, error: APIError, request_id: str, family: Any) -> Response:
    state.gw.ledger.refused(LABEL, request_id, error.status, error.code, time.time())
    return error_response(error, request_id, family)
