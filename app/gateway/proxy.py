"""The chat-completions handler: authenticate, read, validate, forward, meter.

Data flow: `Gateway.chat` -> `validate.check_body` -> `Upstream.send` -> (non-streaming) read the body and
meter its `usage`, or (streaming) hand the upstream response to `relay.SSERelay`. Every request that reaches
the handler ends in exactly one call to `Gateway.finish`, which writes the usage record.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.errors import APIError, Problem, bad_gateway
from app.gateway.accesslog import AccessLog
from app.gateway.auth import Authenticator, Identity
from app.gateway.relay import SSERelay
from app.gateway.upstream import Upstream, forward_headers, map_transport_error, response_headers
from app.ids import new_id
from app.metering.metrics import Metrics
from app.metering.pricing import cost_picousd
from app.metering.recorder import Recorder
from app.metering.store.base import UsageRecord
from app.metering.tokens import context_overflow, count_text, prompt_text
from app.metering.usage import TokenCounts, usage_from_body
from app.openai.rules import Checked, Policy, check_body
from app.settings import Settings

JSON = "application/json"


@dataclass(frozen=True, slots=True)
class Route:
    label: str
    upstream_path: str
    beta: bool = False


CHAT_ROUTES = {
    "/v1/chat/completions": Route("/v1/chat/completions", "/chat/completions"),
    "/chat/completions": Route("/chat/completions", "/chat/completions"),
    "/beta/chat/completions": Route("/beta/chat/completions", "/beta/chat/completions", beta=True),
    "/v1/beta/chat/completions": Route("/beta/chat/completions", "/beta/chat/completions", beta=True),
}


@dataclass(slots=True)
class Exchange:
    """One request through the gateway, from arrival to its usage record."""

    route: Route
    request_id: str
    identity: Identity
    ts: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.perf_counter)
    body: bytes = b""
    model: str = "unknown"
    stream: bool = False
    ttfb_ms: float | None = None
    finished: bool = False
    completion_text: str | None = None  # kept only when server.log_content is on
    warning: str | None = None  # sent back as x-chatgate-warning (R40)

    def response_headers(self, resp: httpx2.Response) -> list[tuple[bytes, bytes]]:
        headers = response_headers(resp.headers, self.request_id)
        if self.warning:
            headers.append((b"x-chatgate-warning", self.warning.encode("ascii", "replace")))
        return headers

    def mark_first_byte(self) -> None:
        if self.ttfb_ms is None:
            self.ttfb_ms = (time.perf_counter() - self.t0) * 1000


def json_response(status: int, content: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(content), status, headers=headers, media_type=JSON)


def error_response(error: APIError, request_id: str | None = None) -> Response:
    headers = dict(error.headers)
    if request_id:
        headers["x-request-id"] = request_id
    return Response(error.to_json(), error.status, headers=headers, media_type=JSON)


def request_id_of(request: Request) -> str:
    rid = request.headers.get("x-request-id", "")
    return rid if 0 < len(rid) <= 200 and rid.isascii() and rid.isprintable() else new_id()


class Gateway:
    def __init__(self, settings: Settings, upstream: Upstream, recorder: Recorder | None,
                 auth: Authenticator, metrics: Metrics) -> None:
        self.settings = settings
        self.policy: Policy = settings.policy()
        self.profiles = dict(self.policy.profiles)
        self.upstream = upstream
        self.recorder = recorder
        self.auth = auth
        self.metrics = metrics
        self.background: set[asyncio.Task[None]] = set()
        self.access_log = AccessLog() if settings.server.access_log else None

    # --- entry points ---------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        route = CHAT_ROUTES[request.scope["path"]]
        request_id = request_id_of(request)
        try:
            identity = await self.auth.identify(request.headers.get("authorization"))
            body = await read_json_body(request, self.settings.limits.max_body_bytes)
        except APIError as error:
            self.metrics.observe_status(route.label, error.status)
            if self.access_log is not None:
                self.access_log.write({"event": "request", "ts": time.time(), "request_id": request_id,
                                       "route": route.label, "status": error.status, "outcome": "refused",
                                       "code": error.code})
            return error_response(error, request_id)
        ex = Exchange(route, request_id, identity, body=body)
        checked = self._check(ex)
        if checked is not None and checked.problems:
            return self._reject(ex, APIError.from_problems(checked.problems))
        overflow = await self._context_guard(ex.body, checked)
        if overflow is not None and self.settings.validation.strict:
            return self._reject(ex, APIError.from_problems([overflow]))
        ex.warning = overflow.message if overflow is not None else None
        try:
            return await self._forward(ex, request)
        except APIError as error:
            self.finish(ex, "upstream_failed", error.status, upstream_status=None)
            return error_response(error, request_id)

    async def validate_only(self, request: Request) -> Response:
        route = Route(request.url.path, "", beta=request.url.path.startswith("/beta"))
        try:
            body = await read_json_body(request, self.settings.limits.max_body_bytes)
        except APIError as error:
            return error_response(error)
        checked = check_body(body, self.policy, beta=route.beta)
        if checked.problems:
            return error_response(APIError.from_problems(checked.problems))
        overflow = await self._context_guard(body, checked)
        if overflow is not None and self.settings.validation.strict:
            return error_response(APIError.from_problems([overflow]))
        model = checked.request.model if checked.request else None
        warnings = [overflow.as_dict()] if overflow is not None else []
        return json_response(200, {"valid": True, "model": model, "warnings": warnings})

    # --- steps -----------------------------------------------------------------------

    def _check(self, ex: Exchange) -> Checked | None:
        if not self.settings.validation.enabled:
            hint = _peek(ex.body)
            ex.model, ex.stream = str(hint.get("model", "unknown"))[:200], hint.get("stream") is True
            return None
        checked = check_body(ex.body, self.policy, beta=ex.route.beta)
        if checked.request is not None:
            ex.model, ex.stream = checked.request.model, checked.request.stream is True
        else:
            ex.model = str(_peek(ex.body).get("model", "unknown"))[:200]
        return checked

    async def _context_guard(self, body: bytes, checked: Checked | None) -> Problem | None:
        """R40, when validation.context_guard is on: only bodies larger than the window are counted."""
        if not self.settings.validation.context_guard or checked is None or checked.request is None:
            return None
        request, profile = checked.request, checked.profile
        if profile is None or len(body) <= profile.context_window:
            return None
        found = await asyncio.to_thread(context_overflow, _peek(body), len(body), profile.context_window,
                                        request.max_tokens)
        if found is None:
            return None
        prompt, total = found
        return Problem("context_length_exceeded", "messages",
                       f"This model's maximum context length is {profile.context_window} tokens. However, "
                       f"you requested about {total} tokens ({prompt} in the messages by chatgate's count, "
                       f"{request.max_tokens or 0} in the completion). Please reduce the length of the "
                       "messages or completion.", "R40")

    def _reject(self, ex: Exchange, error: APIError) -> Response:
        self.finish(ex, "rejected", 400, rule_code=error.code)
        return error_response(error, ex.request_id)

    async def _forward(self, ex: Exchange, request: Request) -> Response:
        body, strip_usage = self._upstream_body(ex)
        headers = forward_headers(request.headers.raw, ex.identity.upstream_authorization, ex.request_id)
        deadline = ex.t0 + self.settings.upstream.total_timeout
        resp = await self.upstream.send("POST", ex.route.upstream_path, headers, body)
        ex.mark_first_byte()
        if ex.stream and resp.status_code == 200:
            if not is_event_stream(resp.headers.get("content-type", "")):
                await resp.aclose()
                raise bad_gateway("DeepSeek answered a streaming request with 200 but not an event stream "
                                  "(upstream broke the protocol).", "upstream_bad_response")
            return SSERelay(self, ex, resp, deadline, strip_usage)
        return await self._buffered(ex, resp, deadline)

    def _upstream_body(self, ex: Exchange) -> tuple[bytes, bool]:
        """The client's bytes, unless chatgate must ask for streamed usage (re-serialised, fields kept)."""
        if not (ex.stream and self.settings.upstream.request_stream_usage):
            return ex.body, False
        data = _peek(ex.body)
        options = data.get("stream_options") or {}
        if not data or not isinstance(options, dict) or options.get("include_usage") is True:
            return ex.body, False  # asked already, or a body chatgate did not validate: leave it alone
        data["stream_options"] = {**options, "include_usage": True}
        return orjson.dumps(data), True

    async def _buffered(self, ex: Exchange, resp: httpx2.Response, deadline: float) -> Response:
        try:
            async with asyncio.timeout(max(deadline - time.perf_counter(), 0.001)):
                content = await read_all(resp)
        except (TimeoutError, httpx2.TransportError, OSError) as exc:
            raise map_transport_error(exc) from None
        finally:
            await resp.aclose()
        headers = ex.response_headers(resp)
        if resp.status_code != 200:
            return RawResponse(resp.status_code, headers, content, functools.partial(
                self.finish, ex, "upstream_error", resp.status_code, upstream_status=resp.status_code))
        is_json, tokens = usage_from_body(content)
        if not is_json:
            raise bad_gateway("DeepSeek answered 200 with a body that is not JSON (upstream broke the "
                              "protocol).", "upstream_bad_response")
        if self.settings.server.log_content:
            ex.completion_text = content.decode("utf-8", "replace")
        exact = tokens is not None
        if tokens is None:
            tokens = await self.estimate(ex, completion_text="")
        record = functools.partial(self.finish, ex, "ok", 200, tokens, exact=exact, upstream_status=200)
        return RawResponse(200, headers, content, record)

    # --- metering ---------------------------------------------------------------------

    async def estimate(self, ex: Exchange, completion_text: str, reasoning_text: str = "") -> TokenCounts:
        """DeepSeek sent no usage: count locally with its tokenizer, off the event loop."""
        def count() -> TokenCounts:
            prompt = count_text(prompt_text(_peek(ex.body)))
            reasoning = count_text(reasoning_text)
            completion = count_text(completion_text) + reasoning
            return TokenCounts(prompt, completion, 0, prompt, reasoning)
        return await asyncio.to_thread(count)

    def finish(self, ex: Exchange, outcome: str, status: int, tokens: TokenCounts | None = None, *,
               exact: bool = True, rule_code: str | None = None, upstream_status: int | None = None) -> None:
        if ex.finished:
            return
        ex.finished = True
        tokens = tokens or TokenCounts()
        profile = self.profiles.get(ex.model)
        pricing = self.settings.pricing
        cost = cost_picousd(tokens, profile.prices if profile else None, ex.ts, pricing.peak_hours_utc,
                            pricing.off_peak_multiplier)
        record = UsageRecord(
            record_id=new_id(), ts=ex.ts, request_id=ex.request_id, key_id=ex.identity.key_id,
            key_name=ex.identity.key_name, team=ex.identity.team, model=ex.model, route=ex.route.label,
            stream=ex.stream, outcome=outcome, rule_code=rule_code, upstream_status=upstream_status,
            prompt_tokens=tokens.prompt_tokens, completion_tokens=tokens.completion_tokens,
            prompt_cache_hit_tokens=tokens.prompt_cache_hit_tokens,
            prompt_cache_miss_tokens=tokens.prompt_cache_miss_tokens,
            reasoning_tokens=tokens.reasoning_tokens,
            cost_picousd=cost, latency_ms=round((time.perf_counter() - ex.t0) * 1000, 3),
            ttfb_ms=round(ex.ttfb_ms, 3) if ex.ttfb_ms is not None else None, tokens_exact=exact)
        if self.recorder is not None:
            self.recorder.record(record)
        self.metrics.observe(record, status)
        if self.access_log is not None:
            line = access_line(record, status)
            if self.settings.server.log_content:
                line["request_body"] = ex.body.decode("utf-8", "replace")
                line["completion"] = ex.completion_text
            self.access_log.write(line)

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def drain(self) -> None:
        while self.background:
            await asyncio.gather(*list(self.background), return_exceptions=True)
        if self.access_log is not None:
            self.access_log.flush()


def access_line(rec: UsageRecord, status: int) -> dict[str, Any]:
    return {
        "event": "request", "ts": rec.ts, "request_id": rec.request_id, "key_id": rec.key_id,
        "team": rec.team, "model": rec.model, "route": rec.route, "stream": rec.stream, "status": status,
        "outcome": rec.outcome,
        "rule_code": rec.rule_code, "prompt_tokens": rec.prompt_tokens,
        "completion_tokens": rec.completion_tokens, "cache_hit_tokens": rec.prompt_cache_hit_tokens,
        "reasoning_tokens": rec.reasoning_tokens, "tokens_exact": rec.tokens_exact,
        "latency_ms": rec.latency_ms, "ttfb_ms": rec.ttfb_ms,
    }


async def read_all(resp: httpx2.Response) -> bytes:
    """The body as sent; decoded only if DeepSeek compressed it although chatgate asked for identity."""
    if "content-encoding" in resp.headers:
        return await resp.aread()
    try:
        return resp.content  # a transport that answers with the body already read (MockTransport)
    except httpx2.ResponseNotRead:
        return b"".join([chunk async for chunk in resp.aiter_raw()])


def _peek(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


class RawResponse(Response):
    """DeepSeek's status, headers and body as they came: no decoding and re-encoding of the headers.

    `before_send` (the usage record) runs before anything is sent: once the client has the end of the
    answer, its record is spooled (a `kill -9` between the two cannot lose it), and a client gone
    mid-send still leaves its record."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes,
                 before_send: Callable[[], None] | None = None) -> None:
        self.status_code = status
        self.body = body
        self.background = None
        self.raw_headers = [*headers, (b"content-length", str(len(body)).encode())]
        self.before_send = before_send

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.before_send is not None:
            self.before_send()
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body})


def is_event_stream(value: str) -> bool:
    return value.split(";", 1)[0].strip().lower() == "text/event-stream"


def is_json_content_type(value: str) -> bool:
    media = value.split(";", 1)[0].strip().lower()
    return media == JSON or (media.startswith("application/") and media.endswith("+json"))


async def read_json_body(request: Request, limit: int) -> bytes:
    if not is_json_content_type(request.headers.get("content-type", "")):
        raise APIError(415, "Request body must be JSON: send 'Content-Type: application/json'.",
                       "invalid_request_error", None, "unsupported_media_type")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)  # one copy at most


def _too_large(limit: int) -> APIError:
    return APIError(413, f"Request body is larger than {limit} bytes (limits.max_body_bytes).",
                    "invalid_request_error", None, "request_too_large")
