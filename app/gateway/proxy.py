"""The handler every API family's POST routes go through: a pipeline of steps, each in the package of its
concern (`Gateway.handle`, in this order):

1. authenticate (app/gateway/auth.py) and read the body once (app/gateway/bodies.py);
2. check it with the family's rules (app/gateway/checking.py, the family's package);
3. repair what the enabled repairs fix, with the turns chatgate relayed (app/repair/loop.py);
4. managed mode: only files the caller's team uploaded (app/files/ownership.py);
5. the context guard (R40, `_context_guard`);
6. admit it against the caller's limits (app/quotas/admission.py);
7. forward it (app/gateway/upstream.py, retries in app/gateway/retry.py), then read the answer whole
   (`_buffered`) or relay the stream (app/gateway/relay.py, whose end is `_stream_ended`); a tool API's
   answer (app/tools/) goes through app/gateway/tool_relay.py, whose end is `_tool_ended`.

Every request that reaches the handler ends in exactly one call to `Ledger.finish` (app/gateway/ledger.py),
which writes the usage record and settles the admission.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx2
import orjson
from starlette.requests import Request
from starlette.responses import Response

from app.errors import (
    MODEL_MAX_CHARS,
    NOT_OWNED,
    APIError,
    Problem,
    bad_gateway,
    model_too_long,
    upstream_auth_failed,
)
from app.files.file_ids import may_name_files
from app.files.ownership import Ownership
from app.gateway.auth import Authenticator
from app.gateway.bodies import origin_of, read_json_body, read_whole_body, request_id_of
from app.gateway.checking import Checkers
from app.gateway.exchange import Exchange, Route
from app.gateway.family import Family, StreamMeter, StreamTurns
from app.gateway.ledger import Ledger
from app.gateway.media import MediaCounter
from app.gateway.notices import Notices, pricier_model
from app.gateway.relay import SSERelay
from app.gateway.responses import RawResponse, error_response, is_event_stream, json_response
from app.gateway.retry import ClientHungUp, KeptAliveOnly, SendOnce, read_answer, retrying
from app.gateway.tool_relay import ToolRelay
from app.gateway.upstream import Upstream, forward_headers
from app.metering.metrics import Metrics
from app.metering.pricing import Pricing
from app.metering.recorder import Recorder
from app.metering.tokens import context_overflow, count_async
from app.quotas.admission import Admitter, limit_error
from app.quotas.gate import Quotas
from app.quotas.model import Refusal
from app.refusals.log import Pending, RefusalLog
from app.repair.loop import Repairer, refusal
from app.repair.memory import TurnMemory
from app.runs.tracker import Runs
from app.settings import Settings
from app.store.base import FileOwnerStore
from app.tools.rules import upload_summary, upload_too_large
from app.tracing.spans import ExchangeTrace, Tracing
from app.verdict import Verdict
from app.wire import kept

log = logging.getLogger("chatgate")
# DeepSeek's 4xx answers kept by the refusal inspector: those about the request (not its key, balance, rate)
KEPT_UPSTREAM = frozenset({400, 404, 409, 413, 415, 422})


@dataclass(frozen=True, slots=True)
class Endpoint:
    route: Route
    family: Family


class Gateway:
    def __init__(self, settings: Settings, upstream: Upstream, recorder: Recorder | None,
                 auth: Authenticator, metrics: Metrics, memory: TurnMemory | None = None,
                 quotas: Quotas | None = None, files: FileOwnerStore | None = None, *, pricing: Pricing,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.pricing = pricing
        self.profiles = settings.profiles()
        self.checkers = Checkers(settings)  # large bodies are checked in processes of their own
        self.upstream = upstream
        self.auth = auth
        self.metrics = metrics
        auth.on_refused = metrics.auth_failure
        self.ledger = Ledger(settings, recorder, metrics, pricing, quotas, self.spawn)
        self.notices = Notices(metrics)
        self.repairs = settings.repair.options()
        self.memory = memory or TurnMemory(None, settings.repair.reasoning_ttl_seconds,
                                           settings.repair.reasoning_cache_bytes)
        self.repairer = Repairer(self.checkers, self.memory, self.repairs,
                                 settings.repair.reasoning_ttl_seconds, metrics)
        self.background: set[asyncio.Task[None]] = set()
        self.quotas = quotas
        self.admitter = Admitter(quotas, settings, self.profiles, pricing) if quotas is not None else None
        self.ownership = Ownership(self.checkers, files)  # the files a request may name (managed mode)
        self.media = MediaCounter(self.checkers, files, self.profiles)  # images and documents' tokens
        self.clock = clock  # a request's start: its usage record's time and price
        self.tracing: Tracing | None = None  # set by State when tracing is on (app.tracing)
        self.refusals: RefusalLog | None = None  # the refusal inspector (server.capture_refusals)
        self.keep_text = settings.server.log_content or settings.tracing.capture_content
        self.pool, self.retrier = retrying(settings, metrics, quotas.alerts if quotas is not None else None)
        self.runs = self.ledger.runs = Runs(
            recorder.store if recorder is not None else None, quotas.book if quotas is not None else None,
            self.profiles, settings.limits.cache_seconds,
            shared=settings.server.workers > 1 or (recorder is not None and recorder.store.server))

    # --- entry points ---------------------------------------------------------------

    async def handle(self, request: Request, endpoint: Endpoint) -> Response:
        route, family = endpoint.route, endpoint.family
        request_id = request_id_of(request)
        trace = self._trace(request, route, request_id)
        try:
            identity = await self.auth.identify_request(request)
            body = await (self._read_upload(request, route) if _upload(route) else read_json_body(
                request, self.settings.limits.max_body_bytes, self.settings.limits.body_timeout_seconds))
        except APIError as error:
            self.ledger.refused(route.label, request_id, error.status, error.code, self.clock())
            if trace is not None:
                trace.early(error.status, error.code)
            return error_response(error, request_id, family)
        ex = Exchange(route, request_id, identity, body=body, ts=self.clock(), trace=trace)
        origin = origin_of(request)
        verdict = await self._check(ex, family, origin)
        if ex.model_length:  # before anything keeps it: the record, the log, the refusal inspector
            return await self._reject(ex, family, model_too_long(ex.model_length))
        ex.parsed = kept(ex.body)
        if trace is not None and verdict is not None:
            trace.max_tokens = verdict.max_tokens
        if verdict is not None and (verdict.problems or verdict.warnings) and self.repairs.enabled:
            verdict = await self.repairer.repair(ex, family, verdict, origin)
        if verdict is not None and verdict.problems:
            return await self._reject(ex, family, refusal(ex, family, verdict))
        if verdict is not None and verdict.warnings:
            ex.warnings.extend(self.notices.warnings(route.label, identity.key_id, verdict.warnings))
        if (pricier := pricier_model(ex.model, ex.priced_as)) is not None:
            ex.warnings.extend(self.notices.tell(route.label, identity.key_id, pricier))
        ex.remember = self.repairer.remembers(family, verdict, ex.identity.caller)
        ex.checked = verdict.request if verdict is not None else None
        if self.auth.managed and not _upload(route) and may_name_files(ex.body, json=verdict is not None):
            foreign = await self.ownership.foreign(ex)
            if foreign is not None:
                code = NOT_OWNED if foreign.status == 404 else foreign.code
                self.ledger.finish(ex, "rejected", foreign.status, rule_code=code)
                return error_response(foreign, request_id, family)
        overflow = await self._context_guard(ex, family, verdict)
        if overflow is not None and self.settings.validation.strict:
            return await self._reject(ex, family, APIError.from_problems([overflow]))
        if overflow is not None:
            ex.warnings.append(overflow.message)
        if ex.route.tool is None and self.pricing.rates(ex.priced_as or ex.model, ex.ts) is None:
            ex.warnings.append(self._unpriced(ex.model))
        stopped = await self.runs.enter(ex, request.headers.raw)
        if stopped is not None:
            self.ledger.finish(ex, "limited", stopped.status, rule_code=stopped.code)
            return error_response(stopped, request_id, family)
        if self.admitter is not None:
            media = functools.partial(self.media.tokens, ex, verdict) if self.media.may_hold(ex, verdict) \
                else None  # a plain body: no look-up of the caller's limits for it
            refused = await self.admitter.admit(ex, verdict, media)
            if refused is not None:
                return self._limit(ex, family, refused)
        self.ledger.sketch(ex)
        verdict = None  # let go before the upstream call (Exchange.release), not held until the end
        try:
            return await self._forward(ex, family, request)
        except ClientHungUp:
            self.ledger.finish(ex, "client_disconnected", 499)
            return Response(status_code=499)
        except APIError as error:
            self.ledger.finish(ex, "upstream_failed", error.status, upstream_status=None)
            return error_response(error, request_id, family)
        except BaseException as exc:
            # chatgate's own fault, or the server stopping mid-request: the exchange still gets its one record
            # (which settles its reservations); app/web/app.py logs and renders the error
            self.ledger.finish(ex, "aborted", 500 if isinstance(exc, Exception) else 499)
            raise

    async def validate_only(self, request: Request, endpoint: Endpoint) -> Response:
        """The dry run: the same checks and repairs (reasoning is restored for the caller whose key is
        sent, if any); nothing is forwarded, nothing is metered. Managed mode asks for a client key, as the
        forwarded route does (a 401 otherwise): the checks cost CPU that only callers may spend."""
        route, family = endpoint.route, endpoint.family
        try:
            identity = await self.auth.identify_request(request)
            body = await (self._read_upload(request, route) if _upload(route) else read_json_body(
                request, self.settings.limits.max_body_bytes, self.settings.limits.body_timeout_seconds))
        except APIError as error:
            return error_response(error, None, family)
        ex = Exchange(route, request_id_of(request), identity, body=body)
        origin = origin_of(request)
        verdict = await (self._check_upload(family, body, route, origin) if _upload(route)
                         else self.checkers.check(family, body, route.beta, origin))
        if verdict.model is not None and len(verdict.model) > MODEL_MAX_CHARS:
            return error_response(model_too_long(len(verdict.model)), ex.request_id, family)
        if (verdict.problems or verdict.warnings) and self.repairs.enabled:
            verdict = await self.repairer.repair(ex, family, verdict, origin)
        if verdict.problems:
            return error_response(refusal(ex, family, verdict), ex.request_id, family)
        overflow = await self._context_guard(ex, family, verdict)
        if overflow is not None and self.settings.validation.strict:
            return error_response(APIError.from_problems([overflow]), ex.request_id, family)
        warnings = [w.as_dict() for w in [*verdict.warnings, *([overflow] if overflow else [])]]
        answer: dict[str, Any] = {"valid": True, "model": verdict.model, "warnings": warnings}
        if ex.repaired is not None and ex.repaired.applied:
            answer["repairs"] = [a.as_dict() for a in ex.repaired.applied]
            answer["repaired_body"] = ex.json()
        return json_response(200, answer)

    # --- steps -----------------------------------------------------------------------

    def _unpriced(self, model: str) -> str:
        currency = self.pricing.currency
        how = ("refused where a budget applies, else recorded at that price"
               if self.settings.limits.unpriced == "refuse" else "reserved and recorded at that price")
        return (f"chatgate has no {currency} price for the model {model[:64]!r}: the catalogue's highest "
                f"price stands in for it ({how}); set its price in [models.\"<name>\"] (docs/metering.md"
                "#models-without-a-price)")

    async def _check(self, ex: Exchange, family: Family, origin: str) -> Verdict | None:
        if not self.settings.validation.enabled:
            if ex.route.tool is not None:
                ex.model, ex.stream = ex.route.tool.name, False
            else:
                ex.describe(None)
            return None
        verdict = await (self._check_upload(family, ex.body, ex.route, origin) if _upload(ex.route)
                         else self.checkers.check(family, ex.body, ex.route.beta, origin))
        ex.describe(verdict)
        return verdict

    async def _read_upload(self, request: Request, route: Route) -> bytes:
        """A tool API's upload (OCR, ASR): read whole, to be checked and sent again by a retry."""
        assert route.tool is not None
        return await read_whole_body(request, route.tool.upload, self.settings.limits.body_timeout_seconds,
                                     functools.partial(upload_too_large, route.tool.name))

    async def _check_upload(self, family: Family, body: bytes, route: Route, origin: str) -> Verdict:
        """Multipart, not JSON: the tool's own checks (they only find the parts, on the loop)."""
        return family.check(body, beta=route.beta, origin=origin)

    async def _context_guard(self, ex: Exchange, family: Family, verdict: Verdict | None) -> Problem | None:
        """R40, when validation.context_guard is on: only bodies larger than the window are counted."""
        if not self.settings.validation.context_guard or verdict is None or verdict.model is None:
            return None
        profile = verdict.profile
        if profile is None or len(ex.body) <= profile.context_window:
            return None
        data = ex.json()
        text = functools.partial(family.prompt_text, data)
        found = await count_async(functools.partial(context_overflow, text, len(ex.body),
                                                    profile.context_window, verdict.max_tokens))
        if found is None:
            return None
        prompt, total = found
        return Problem("context_length_exceeded", "messages",
                       f"This model's maximum context length is {profile.context_window} tokens. However, "
                       f"you requested about {total} tokens ({prompt} in the messages by chatgate's count, "
                       f"{verdict.max_tokens or 0} in the completion). Please reduce the length of the "
                       "messages or completion.", "R40")

    # --- refusals --------------------------------------------------------------------

    def _limit(self, ex: Exchange, family: Family, refusal: Refusal) -> Response:
        error = limit_error(refusal)
        self.ledger.finish(ex, "limited", error.status, rule_code=refusal.code)
        self.metrics.limited.labels(refusal.code).inc()
        return error_response(error, ex.request_id, family)

    async def _reject(self, ex: Exchange, family: Family, error: APIError) -> Response:
        if self.quotas is not None:  # a refused request is one of its caller's requests per minute too
            limited = await self.quotas.count_refused(ex.identity.team, ex.identity.key_id)
            if limited is not None:
                return self._limit(ex, family, limited)
        if ex.trace is not None:
            ex.trace.refused(error.problems)
        if self.refusals is not None:
            problems = [p.as_dict() for p in error.problems] or [
                {"code": error.code, "param": error.param, "message": error.message, "rule": None}]
            self._keep_refusal(ex, 400, "chatgate", problems)
        self.ledger.finish(ex, "rejected", 400, rule_code=error.code)
        return error_response(error, ex.request_id, family)

    # --- observability ---------------------------------------------------------------

    def _trace(self, request: Request, route: Route, request_id: str) -> ExchangeTrace | None:
        if self.tracing is None:
            return None
        return self.tracing.start(request.method, request.scope.get("path", route.label), route.label,
                                  request.scope, request_id)

    def _keep_refusal(self, ex: Exchange, status: int, source: str, problems: list[dict[str, Any]] | None,
                      answer: bytes = b"") -> None:
        """Hand a refused request to the inspector (redacted and stored off the request path)."""
        assert self.refusals is not None
        i = ex.identity
        body = upload_summary(ex.body) if _upload(ex.route) else ex.body  # never a file of 100 MiB
        self.refusals.add(Pending(ex.request_id, ex.ts, i.key_id, i.key_name, i.team, ex.route.label,
                                  ex.model,
                                  status, source, problems, body, answer))

    # --- forwarding ------------------------------------------------------------------

    async def _forward(self, ex: Exchange, family: Family, request: Request) -> Response:
        body, usage_filter = ex.body, None
        if ex.stream and self.settings.upstream.request_stream_usage:
            asked = family.ask_stream_usage(ex.json())
            if asked is not None:
                body, usage_filter = asked, family.usage_filter()
        ex.release()
        pooled = self.pool is not None
        headers = forward_headers(request.headers.raw, None if pooled else ex.identity.upstream_authorization,
                                  ex.request_id, managed=self.auth.managed)
        deadline = ex.t0 + self.settings.upstream.total_timeout
        query = request.scope.get("query_string", b"")  # Claude Code's ?beta=true goes on to DeepSeek
        target = self.upstream.url_of(ex.route.upstream_path, query.decode("latin-1")) if query else \
            ex.route.upstream_path
        ex.tries = self.retrier.tries(deadline)
        send = functools.partial(self._send_once, ex, target, headers, body)
        resp = await self.retrier.open(ex, send, request.receive)
        ex.mark_first_byte()
        if ex.route.tool is not None:
            return self._tool_answer(ex, family, resp, deadline, send)
        if ex.stream and resp.status_code == 200:
            if not is_event_stream(resp.headers.get("content-type", "")):
                await resp.aclose()
                raise bad_gateway("DeepSeek answered a streaming request with 200 but not an event stream "
                                  "(upstream broke the protocol).", "upstream_bad_response")
            turns = family.stream_turns() if ex.remember else None
            on_end = functools.partial(self._stream_ended, family, turns)
            reopen = functools.partial(self.retrier.reopen, ex, send, receive=None)  # the relay watches
            return SSERelay(ex, resp, deadline, family.meter(turns), on_end, self.spawn, family.stream_error,
                            usage_filter, reopen if self.retrier.policy.retries else None,
                            self.settings.limits.max_upstream_bytes)
        return await self._buffered(ex, family, resp, deadline, send, request)

    def _tool_answer(self, ex: Exchange, family: Family, resp: httpx2.Response, deadline: float,
                     send: SendOnce) -> Response:
        """A tool API's answer (app/gateway/tool_relay.py): its keep-alives relayed as they come, the answer
        held until whole, its record made from it (`_tool_ended`)."""
        if resp.status_code == 401 and self.auth.managed:
            self.spawn(resp.aclose())
            return self._upstream_refused_key(ex, family)
        reopen = functools.partial(self.retrier.reopen, ex, send, receive=None)  # the relay watches
        return ToolRelay(ex, resp, deadline, functools.partial(self._tool_ended, family),
                         reopen if self.retrier.policy.retries else None)

    def _tool_ended(self, family: Family, ex: Exchange, outcome: str, status: int, content: bytes | None
                    ) -> None:
        """A tool API's answer is over: its record, with what it is billed for if it succeeded."""
        if ex.finished:
            return
        units = family.billed_units(ex.json(), content) if status == 200 and content is not None else None
        if (self.refusals is not None and status in KEPT_UPSTREAM and content is not None
                and not _upload(ex.route)):
            self._keep_refusal(ex, status, "deepseek", None, content)
        self.ledger.finish(ex, outcome, status, units=units,
                           upstream_status=status if outcome in ("ok", "upstream_error") else None)

    def _upstream_refused_key(self, ex: Exchange, family: Family) -> Response:
        """DeepSeek's 401 to chatgate's own key (managed mode): logged for the operator, chatgate's 502 to the
        client. The account pool sets the account aside and sends its `account_unavailable` webhook
        (app/gateway/accounts.py) before this answer is made."""
        error = upstream_auth_failed(ex.request_id)
        self.ledger.finish(ex, "upstream_error", error.status, upstream_status=401)
        return error_response(error, ex.request_id, family)

    async def _send_once(self, ex: Exchange, target: str | httpx2.URL, headers: list[tuple[bytes, bytes]],
                         body: bytes, authorization: bytes | None) -> httpx2.Response:
        if authorization is not None:
            headers = [*headers, (b"authorization", authorization)]
        if ex.trace is not None:  # one CLIENT span per upstream attempt
            headers = ex.trace.start_attempt(headers, ex.model, ex.stream)
        return await self.upstream.send("POST", target, headers, body)

    async def _buffered(self, ex: Exchange, family: Family, resp: httpx2.Response, deadline: float,
                        send: SendOnce, request: Request) -> Response:
        while True:
            try:
                content = await read_answer(resp, deadline, resp.status_code == 200 and not ex.tries.spent,
                                            self.settings.limits.max_upstream_bytes)
                break
            except KeptAliveOnly as dropped:  # blank lines only so far: nothing of the answer is lost
                resp = await self.retrier.reopen(ex, send, dropped.error, request.receive)
        headers = ex.response_headers(resp)
        if resp.status_code == 401 and self.auth.managed:
            return self._upstream_refused_key(ex, family)
        if resp.status_code != 200:
            if self.refusals is not None and resp.status_code in KEPT_UPSTREAM:
                self._keep_refusal(ex, resp.status_code, "deepseek", None, content)
            return RawResponse(resp.status_code, headers, content, functools.partial(
                self.ledger.finish, ex, "upstream_error", resp.status_code, upstream_status=resp.status_code),
                ex.rate_headers)
        try:
            answer = orjson.loads(content)
        except orjson.JSONDecodeError:
            raise bad_gateway("DeepSeek answered 200 with a body that is not JSON (upstream broke the "
                              "protocol).", "upstream_bad_response") from None
        if ex.remember and (turn := family.answer_turn(answer)) is not None:
            await self.memory.remember(ex.identity.caller, family.turn_kind, turn,  # before the client has it
                                       self._tenant(ex))
        if ex.trace is not None:
            ex.trace.answer(answer)
        if self.keep_text:
            ex.completion_text = content.decode("utf-8", "replace")
        tokens = family.usage(answer)
        if (served := family.served_model(answer)) is not None:
            ex.model = ex.priced_as = served[:MODEL_MAX_CHARS]
        exact = tokens is not None
        if tokens is None:
            tokens = await self.ledger.estimate(ex, functools.partial(family.prompt_text, ex.json()), "",
                                                media=await self.media.tokens(ex, None))
        record = functools.partial(self.ledger.finish, ex, "ok", 200, tokens, exact=exact,
                                   upstream_status=200, calls=family.model_calls(answer))
        return RawResponse(200, headers, content, record, ex.rate_headers)

    async def _stream_ended(self, family: Family, turns: StreamTurns | None, ex: Exchange,
                            meter: StreamMeter, outcome: str, status: int) -> None:
        """The relay's one call when the upstream side of a stream has ended (before its last event is
        relayed): remember its tool-call turn, meter it."""
        if ex.finished:
            return
        turn = turns.turn(lambda: meter.reasoning) if turns is not None and outcome == "ok" else None
        if turn is not None:
            await self.memory.remember(ex.identity.caller, family.turn_kind, turn, self._tenant(ex))
        if self.keep_text:
            ex.completion_text = meter.text
        if meter.model is not None:
            ex.model = ex.priced_as = meter.model[:MODEL_MAX_CHARS]
        if meter.usage is not None:
            self.ledger.finish(ex, outcome, status, meter.usage, upstream_status=200, calls=meter.calls)
            return
        tokens = await self.ledger.estimate(ex, functools.partial(family.prompt_text, ex.json()), meter.text,
                                            meter.reasoning, await self.media.tokens(ex, None))
        self.ledger.finish(ex, outcome, status, tokens, exact=False, upstream_status=200, calls=meter.calls)

    def _tenant(self, ex: Exchange) -> str:
        """Whose share of the reasoning memory a turn takes: its team's in managed mode (teams are made by
        the operator), its caller's in passthrough (every caller is in the one passthrough team)."""
        return ex.identity.team if self.auth.managed else ex.identity.caller

    # --- background work ----------------------------------------------------------------

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def drain(self) -> None:
        while self.background:
            await asyncio.gather(*list(self.background), return_exceptions=True)
        await self.runs.close()
        if self.ledger.access_log is not None:
            self.ledger.access_log.flush()


def _upload(route: Route) -> bool:
    """A tool API's multipart upload (OCR, ASR): its body is not JSON."""
    return route.tool is not None and route.tool.upload > 0
