"""The routes where chatgate counts a request's tokens itself, as each family declares them
(`Family.token_counts`: Anthropic's `POST /anthropic/v1/messages/count_tokens`, which DeepSeek documents
not), with DeepSeek's V4 tokenizer. Authenticated and rate-limited like the family's forwarded route (a count
takes one request of the key's rpm and a concurrency slot, no tokens); nothing is forwarded or billed.

What one count may cost is bounded: the body by limits.max_body_bytes (413), the exact count by
limits.count_tokens_exact_bytes of prompt text. Above that, the answer is an upper bound (the text's UTF-8
bytes: every token covers at least one byte), said so in `x-chatgate-warning`; it is taken where the body
is read (a checker process for a large one), so that the text does not come back to the server. An exact
count runs on the tokenizer's worker thread with the interpreter lock released (chatgate/metering/tokens.py):
other requests go on.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from chatgate.errors import APIError
from chatgate.gateway.bodies import read_json_body, request_id_of
from chatgate.gateway.family import Family
from chatgate.gateway.responses import error_response, json_response
from chatgate.gateway.state import State
from chatgate.gateway.strict import parse_strictly
from chatgate.metering.tokens import count_async, count_text
from chatgate.quotas.admission import limit_error
from chatgate.quotas.model import Admission, Refusal


def add_count_tokens(app: FastAPI, state: State, families: list[Family]) -> None:
    for family in families:
        for path, label, text_of in family.token_counts:
            app.router.add_route(path, _counter(state, family, label, text_of), methods=["POST"],
                                 include_in_schema=False)


def _counter(state: State, family: Family, label: str, text_of: Callable[[Any], str]) -> Any:
    async def count_tokens(request: Request) -> Response:
        request_id, ts = request_id_of(request), time.time()
        gw, limits = state.gw, state.settings.limits
        try:
            identity = await gw.auth.identify_request(request)
            body = await read_json_body(request, limits.max_body_bytes, limits.body_timeout_seconds)
            exact_bytes = limits.count_tokens_exact_bytes
            text = await gw.checkers.run(len(body), functools.partial(_prompt_of, text_of, body, exact_bytes))
        except APIError as error:
            return _refused(state, error, label, request_id, family)
        admission: Admission | None = None
        if gw.quotas is not None:
            admitted = await gw.quotas.admit(identity.team, identity.key_id, lambda at: (0, 0), started_at=ts)
            if isinstance(admitted, Refusal):
                limited = limit_error(admitted)
                gw.metrics.limited.labels(admitted.code).inc()
                return _refused(state, limited, label, request_id, family)
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
        gw.ledger.note(label, request_id, 200, "counted", ts, input_tokens=tokens, exact=exact)
        return json_response(200, {"input_tokens": tokens}, headers)

    return count_tokens


def _prompt_of(text_of: Callable[[Any], str], body: bytes, exact_bytes: int) -> str | int:
    """The text to count (in a checker process for a large body), or the refusal. Above `exact_bytes` of
    text, its UTF-8 bytes instead: the upper bound answered (every token covers at least one byte), and the
    text never crosses the pipe back (a 40 MB prompt grew the server by 150 MB, kept after the count)."""
    data, strict = parse_strictly(body)
    if strict is not None:
        raise APIError.from_problems([strict])
    if data is None:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise APIError(400, "Request body is not valid JSON.", "invalid_request_error", None,
                           "invalid_json") from None
    text = text_of(data)  # the family's (it refuses a body it cannot count)
    if len(text) * 4 <= exact_bytes:  # UTF-8 takes at most 4 bytes a character
        return text
    size = len(text.encode("utf-8", "surrogatepass"))
    return size if size > exact_bytes else text


def _refused(state: State, error: APIError, label: str, request_id: str, family: Family) -> Response:
    state.gw.ledger.refused(label, request_id, error.status, error.code, time.time())
    return error_response(error, request_id, family)
