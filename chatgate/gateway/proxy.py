"""The handler every API family's POST routes go through: a pipeline of steps, each in the package of its
concern (`Gateway.handle`, in this order):

1. authenticate (chatgate/gateway/auth.py) and read the body once (chatgate/gateway/bodies.py);
2. check it with the family's rules (chatgate/gateway/checking.py, the family's package);
3. repair what the enabled repairs fix, with the turns chatgate relayed (chatgate/repair/loop.py);
4. managed mode: only files the caller's team uploaded (chatgate/files/ownership.py);
5. the context guard (R40, `_context_guard`);
6. admit it against the caller's limits (chatgate/quotas/admission.py);
7. forward it (chatgate/gateway/upstream.py, retries in chatgate/gateway/retry.py), then read the answer whole
   (`_buffered`) or relay the stream (the generator `_events`, framed by chatgate/gateway/relay.py, whose end
   is `_stream_ended`); a tool API's answer (chatgate/tools/) is relayed by the generator `_tool_pieces`,
   whose end is `_tool_ended`.

Every request that reaches the handler ends in exactly one call to `Ledger.finish`
(chatgate/gateway/ledger.py), which writes the usage record and settles the admission.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncGenerator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import httpx2
import orjson
from starlette.requests import Request
from starlette.responses import Response

from chatgate.confirmation.claims import CATALOGUE_FAMILY, OTHER_MODEL
from chatgate.confirmation.service import Confirmations
from chatgate.errors import (
    MODEL_MAX_CHARS,
    NOT_OWNED,
    APIError,
    Problem,
    bad_gateway,
    model_too_long,
    upstream_auth_failed,
)
from chatgate.files.file_ids import may_name_files
from chatgate.files.ownership import Ownership
from chatgate.gateway.auth import Authenticator
from chatgate.gateway.background import Background
from chatgate.gateway.bodies import origin_of, read_json_body, read_whole_body, request_id_of
from chatgate.gateway.checking import Checked, Checkers
from chatgate.gateway.exchange import Exchange, Route
from chatgate.gateway.family import Family, StreamMeter, StreamTurns
from chatgate.gateway.ledger import Ledger
from chatgate.gateway.media import MediaCounter
from chatgate.gateway.notices import Notices, pricier_model
from chatgate.gateway.relay import (
    SLOW_CLIENT_GRACE_S,
    TRANSPORT_FAILURES,
    UPSTREAM_FAILURES,
    WAIT,
    EventFramer,
    Head,
    Piece,
    Relayed,
    drain,
)
from chatgate.gateway.responses import RawResponse, error_response, is_event_stream, json_response
from chatgate.gateway.retry import ClientHungUp, Retrier, SendOnce, Tries
from chatgate.gateway.upstream import (
    Answer,
    KeptAliveOnly,
    Upstream,
    forward_headers,
    map_transport_error,
    next_chunk,
    read_whole,
)
from chatgate.metering.metrics import Metrics
from chatgate.metering.pricing import Pricing
from chatgate.metering.tokens import context_overflow, count_async
from chatgate.quotas.admission import Admitter, limit_error
from chatgate.quotas.gate import Quotas
from chatgate.quotas.model import Refusal
from chatgate.refusals.log import Pending, RefusalLog
from chatgate.repair.loop import Repairer, refusal
from chatgate.repair.memory import TurnMemory
from chatgate.runs.tracker import Follow, Runs
from chatgate.settings import Settings
from chatgate.store.base import FileOwnerStore
from chatgate.tools.rules import upload_summary, upload_too_large
from chatgate.tracing.spans import ExchangeTrace, Tracing
from chatgate.verdict import Verdict

log = logging.getLogger("chatgate")
# DeepSeek's 4xx answers kept by the refusal inspector: those about the request (not its key, balance, rate)
KEPT_UPSTREAM = frozenset({400, 404, 409, 413, 415, 422})


@dataclass(frozen=True, slots=True)
class Endpoint:
    route: Route
    family: Family


class Gateway:
    """The request path; its collaborators are built by State.start (chatgate/gateway/state.py)."""

    def __init__(self, settings: Settings, *, upstream: Upstream, auth: Authenticator, metrics: Metrics,
                 ledger: Ledger, checkers: Checkers, memory: TurnMemory, retrier: Retrier,
                 background: Background, pricing: Pricing, runs: Runs | None, quotas: Quotas | None = None,
                 files: FileOwnerStore | None = None, tracing: Tracing | None = None,
                 refusals: RefusalLog | None = None, confirmations: Confirmations | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.pricing = pricing
        self.profiles = settings.profiles()
        self.checkers = checkers  # large bodies are checked in processes of their own
        self.upstream = upstream
        self.auth = auth
        self.metrics = metrics
        self.ledger = ledger
        self.runs = runs  # agent runs: each request's run, and its bounds (chatgate/runs/); None: off
        self.notices = Notices(metrics)
        self.repairs = settings.repair.options()
        self.memory = memory
        self.repairer = Repairer(self.checkers, self.memory, self.repairs,
                                 settings.repair.reasoning_ttl_seconds, metrics)
        self.background = background
        self.quotas = quotas
        self.admitter = Admitter(quotas, settings, self.profiles, pricing) if quotas is not None else None
        self.ownership = Ownership(self.checkers, files)  # the files a request may name (managed mode)
        self.media = MediaCounter(self.checkers, files, self.profiles)  # images and documents' tokens
        self.clock = clock  # a request's start: its usage record's time and price
        self.tracing = tracing  # when tracing is on (chatgate.tracing)
        self.refusals = refusals  # the refusal inspector (server.capture_refusals)
        self.confirmations = confirmations  # refusals confirmed with DeepSeek (validation.confirm_every_s)
        self.keep_text = settings.server.log_content or settings.tracing.capture_content
        self.retrier = retrier
        self.pool = retrier.pool

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
        checked = await self._check(ex, family, origin)
        if ex.model_length:  # before anything keeps it: the record, the log, the refusal inspector
            return await self._reject(ex, family, model_too_long(ex.model_length))
        verdict = checked.verdict if checked is not None else None
        ex.parsed = sent = checked.parse if checked is not None else None
        checked = None
        if trace is not None and verdict is not None:
            trace.max_tokens = verdict.max_tokens
        if verdict is not None and (verdict.problems or verdict.warnings) and self.repairs.enabled:
            verdict = await self.repairer.repair(ex, family, verdict, origin)
        if verdict is not None and verdict.problems:
            forwarded = await self._to_confirm(ex, family, verdict)
            if forwarded is None:
                return await self._reject(ex, family, refusal(ex, family, verdict))
            verdict = forwarded
        if verdict is not None and verdict.warnings:
            if self.confirmations is not None:
                if promoted := await self.confirmations.promoted(verdict.warnings, self._evidence_model(ex)):
                    return await self._reject(ex, family, APIError.from_problems(promoted))
                ex.watch = self.confirmations.watch_warnings(verdict.warnings, self._evidence_model(ex),
                                                             ex.watch)
            ex.warnings.extend(self.notices.warnings(route.label, identity.key_id, verdict.warnings))
        if (pricier := pricier_model(ex.model, ex.priced_as)) is not None:
            ex.warnings.extend(self.notices.tell(route.label, identity.key_id, pricier))
        ex.remember = self.repairer.remembers(family, verdict, ex.identity.caller)
        ex.checked = verdict.request if verdict is not None else None
        if self.auth.managed and not _upload(route) and may_name_files(ex.body, json=verdict is not None):
            ex.files, foreign = await self.ownership.foreign(ex)
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
        if (runs := self.runs) is not None:
            answers = verdict.answers if verdict is not None else None
            marked = runs.mark(ex, request.headers.raw, sent, answers)
            if marked is Follow.FOLLOW:
                ex.run, stopped = await runs.enter(ex, request.headers.raw, sent)
                if stopped is not None:
                    self.ledger.finish(ex, "limited", stopped.status, rule_code=stopped.code)
                    return error_response(stopped, request_id, family)
            else:
                ex.run = marked
        sent = None  # let go before the upstream call, as `verdict` below
        if self.admitter is not None:
            media = functools.partial(self.media.tokens, ex, verdict) if self.media.may_hold(ex, verdict) \
                else None  # a plain body: no look-up of the caller's limits for it
            admitted = await self.admitter.admit(ex, verdict, media)
            if isinstance(admitted, Refusal):
                return self._limit(ex, family, admitted)
            ex.admission = admitted
        self.ledger.sketch(ex)
        verdict = None  # let go before the upstream call (Exchange.release), not held until the end
        try:
            return await self._forward(ex, family, request)
        except ClientHungUp:
            self._unwatched(ex, family)
            self.ledger.finish(ex, "client_disconnected", 499)
            return Response(status_code=499)
        except APIError as error:
            self._unwatched(ex, family)
            self.ledger.finish(ex, "upstream_failed", error.status, upstream_status=None)
            return error_response(error, request_id, family)
        except BaseException as exc:
            self._unwatched(ex, family)
            # chatgate's own fault, or the server stopping mid-request: the exchange still gets its one record
            # (which settles its reservations); chatgate/web/app.py logs and renders the error
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
        verdict = (await self._check_body(family, body, route, origin)).verdict
        if verdict.model is not None and len(verdict.model) > MODEL_MAX_CHARS:
            return error_response(model_too_long(len(verdict.model)), ex.request_id, family)
        if (verdict.problems or verdict.warnings) and self.repairs.enabled:
            verdict = await self.repairer.repair(ex, family, verdict, origin)
        if self.confirmations is not None and route.tool is None:  # what DeepSeek said of the rules
            ex.describe(verdict)
            model = self._evidence_model(ex)
            if verdict.problems and await self.confirmations.disputed(verdict.problems, model):
                told = [dataclasses.replace(p, warning=True, message=_disputed_text(p, False))
                        for p in verdict.problems]
                verdict = dataclasses.replace(verdict, problems=[], warnings=[*verdict.warnings, *told])
            if verdict.warnings and (promoted := await self.confirmations.promoted(verdict.warnings, model)):
                verdict = dataclasses.replace(verdict, problems=promoted)
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

    async def _check(self, ex: Exchange, family: Family, origin: str) -> Checked | None:
        """The family's check of the body (None: validation is off), and what the exchange is metered by."""
        if not self.settings.validation.enabled:
            if ex.route.tool is not None:
                ex.model, ex.stream = ex.route.tool.name, False
            else:
                ex.describe(None)
            return None
        checked = await self._check_body(family, ex.body, ex.route, origin)
        ex.describe(checked.verdict)
        return checked

    async def _read_upload(self, request: Request, route: Route) -> bytes:
        """A tool API's upload (OCR, ASR): read whole, to be checked and sent again by a retry."""
        assert route.tool is not None
        return await read_whole_body(request, route.tool.upload, self.settings.limits.body_timeout_seconds,
                                     functools.partial(upload_too_large, route.tool.name))

    async def _check_body(self, family: Family, body: bytes, route: Route, origin: str) -> Checked:
        """R1 and the family's rules (chatgate/gateway/checking.py); a tool API's multipart upload, not JSON,
        by the tool's own checks (they only find the parts, on the loop)."""
        if _upload(route):
            return Checked(family.check(body, beta=route.beta, origin=origin))
        return await self.checkers.check(family, body, route.beta, origin)

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

    # --- rules confirmed with DeepSeek (chatgate/confirmation/) ---------------------------------

    def _evidence_model(self, ex: Exchange) -> str:
        """The model a rule's evidence is kept for: a served model's name, one key for all the others."""
        return ex.priced_as if ex.priced_as in self.profiles else OTHER_MODEL

    async def _to_confirm(self, ex: Exchange, family: Family, verdict: Verdict) -> Verdict | None:
        """A refused request forwarded as it is to confirm its refusal with DeepSeek, or with the warnings
        of rules DeepSeek disputed: the verdict it goes on with (its problems as warnings); None: refused."""
        if self.confirmations is None or ex.route.tool is not None:
            return None
        watch = await self.confirmations.decide(verdict.problems, self._evidence_model(ex))
        if watch is None:
            return None
        ex.watch, ex.refusal = watch, refusal(ex, family, verdict)
        pending = {c.rule for c in watch.pending}
        told = [dataclasses.replace(p, warning=True, message=_disputed_text(p, p.rule in pending))
                for p in verdict.problems]
        return dataclasses.replace(verdict, problems=[], warnings=[*verdict.warnings, *told])

    async def _learn(self, ex: Exchange, family: Family, status: int, content: bytes | None) -> bool:
        """Keep what DeepSeek's answer says about the rules; True when the client gets chatgate's own
        refusal instead (a refusal DeepSeek confirmed). What a refusal or a confirmation teaches is kept
        before the client has the answer (the next request must find it); the scores of a warned request
        DeepSeek accepted are added up in memory and written now and then (`Confirmations.score`)."""
        c, watch = self.confirmations, ex.watch
        if c is None or (watch is None and status not in KEPT_UPSTREAM):
            return False
        model = self._evidence_model(ex)
        name = CATALOGUE_FAMILY.get(family.name, family.name)
        if watch is not None and not watch.confirming and status not in KEPT_UPSTREAM:
            if (flush := c.score(watch, status)) is not None:  # an accepted warned request: a count
                self.spawn(flush)
            return False
        if watch is None or not watch.confirming:  # DeepSeek refused it: kept before the client knows
            await c.answered(watch, status, content, name, model, ex.request_id)
            return False
        await c.answered(watch, status, content, name, model, ex.request_id)
        if status < 300:
            ex.rule_note = "disputed:" + ",".join(claim.rule for claim in watch.pending)
            return False
        return status in KEPT_UPSTREAM

    def _unwatched(self, ex: Exchange, family: Family) -> None:
        """A watched request that got no answer from DeepSeek: its leases go, nothing is learnt."""
        if self.confirmations is not None and ex.watch is not None and not ex.watch.done:
            self.spawn(self.confirmations.answered(ex.watch, 599, None, family.name, ex.model, ex.request_id))

    def _confirmed(self, ex: Exchange, family: Family, status: int, content: bytes) -> Response:
        """DeepSeek refused a request forwarded to confirm chatgate's refusal: the client gets chatgate's own
        error, as without confirmation; the record says what DeepSeek answered."""
        error = ex.refusal
        assert error is not None
        if self.refusals is not None:
            problems = [p.as_dict() for p in error.problems]
            self._keep_refusal(ex, 400, "chatgate", problems, content)
        self.ledger.finish(ex, "rejected", error.status, rule_code=error.code, upstream_status=status)
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
        tries = ex.tries = self.retrier.tries(deadline, ex.identity.team, ex.files, ex.trace)
        send = functools.partial(self._send_once, ex, target, headers, body)
        resp = await self.retrier.open(tries, send, request.receive)
        ex.mark_first_byte()
        if ex.route.tool is not None:
            return self._tool_answer(ex, family, resp, tries, send)
        if ex.stream and resp.status_code == 200:
            if not is_event_stream(resp.header("content-type") or ""):
                await resp.aclose()
                raise bad_gateway("DeepSeek answered a streaming request with 200 but not an event stream "
                                  "(upstream broke the protocol).", "upstream_bad_response")
            if ex.watch is not None:
                await self._learn(ex, family, 200, None)
            turns = family.stream_turns() if ex.remember else None
            framer = EventFramer(family.meter(turns), family.stream_error, usage_filter, ex.trace,
                                 self.settings.limits.max_upstream_bytes)
            events = self._events(ex, family, resp, tries, send, framer, turns)
            return Relayed(events, Head(200, ex.response_headers(resp)), ex.rate_headers,
                           deadline=_client_deadline(tries))
        return await self._buffered(ex, family, resp, tries, send, request)

    def _tool_answer(self, ex: Exchange, family: Family, resp: Answer, tries: Tries, send: SendOnce
                     ) -> Response:
        """A tool API's answer: its keep-alives relayed as they come, the answer held until whole, its record
        made from it (`_tool_pieces`)."""
        if resp.status_code == 401 and self.auth.managed:
            self.spawn(resp.aclose())
            return self._upstream_refused_key(ex, family)
        return Relayed(self._tool_pieces(ex, family, resp, tries, send), None, ex.rate_headers, lazy=False,
                       deadline=_client_deadline(tries))

    async def _tool_pieces(self, ex: Exchange, family: Family, answer: Answer, tries: Tries, send: SendOnce
                           ) -> AsyncGenerator[Head | Piece, None]:
        """A tool API's answer for the client (relay.Relayed sends it): the newline keep-alives DeepSeek sends
        before an answer that takes long (OCR) as they come, the answer itself once it is whole, after its
        record (what it is billed for is read from it). Before anything of the answer arrived, a failure is
        retried on the same client response; a later one, or once the retries are spent, ends it: with
        chatgate's error as its status if nothing was sent yet, else with the error's JSON after the
        keep-alives (as DeepSeek itself answers an error that follows keep-alives)."""
        held: list[bytes] = []
        started = False  # the head went out (with the first keep-alive)
        try:
            while True:
                try:
                    while chunk := await next_chunk(answer, tries.deadline):
                        if not held and not chunk.strip():  # a keep-alive before the answer
                            if not started:
                                started = True
                                yield Head(answer.status_code, ex.response_headers(answer))
                            yield chunk, False
                        else:
                            held.append(chunk)
                    break
                except TRANSPORT_FAILURES as exc:
                    error = map_transport_error(exc)
                    if held or not self.retrier.policy.retries:
                        raise error from None
                    await answer.aclose()
                    answer = await self.retrier.reopen(tries, send, error, None)  # Relayed watches the client
            content = b"".join(held)
            status = answer.status_code
            self._tool_ended(family, ex, "ok" if status == 200 else "upstream_error", status, content)
            if not started:
                length = (b"content-length", str(len(content)).encode())
                yield Head(status, [*ex.response_headers(answer), length])
            yield content, True
        except APIError as error:
            self._tool_ended(family, ex, "upstream_failed", error.status, None)
            body = error.to_json()
            if not started:
                extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in error.headers.items()]
                yield Head(error.status, [(b"content-type", b"application/json"),
                                          (b"content-length", str(len(body)).encode()),
                                          (b"x-request-id", ex.request_id.encode("latin-1")), *extra])
            yield body, True
        finally:
            await answer.aclose()
            if not ex.finished:  # the client went away first
                self._tool_ended(family, ex, "client_disconnected", 499, None)

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
        (chatgate/gateway/accounts.py) before this answer is made."""
        error = upstream_auth_failed(ex.request_id)
        self.ledger.finish(ex, "upstream_error", error.status, upstream_status=401)
        return error_response(error, ex.request_id, family)

    async def _send_once(self, ex: Exchange, target: str | httpx2.URL, headers: list[tuple[bytes, bytes]],
                         body: bytes, authorization: bytes | None) -> Answer:
        if authorization is not None:
            headers = [*headers, (b"authorization", authorization)]
        if ex.trace is not None:  # one CLIENT span per upstream attempt
            headers = ex.trace.start_attempt(headers, ex.model, ex.stream)
        return await self.upstream.send("POST", target, headers, body)

    async def _buffered(self, ex: Exchange, family: Family, resp: Answer, tries: Tries, send: SendOnce,
                        request: Request) -> Response:
        while True:
            try:
                content = await read_whole(resp, tries.deadline, self.settings.limits.max_upstream_bytes,
                                           retryable=resp.status_code == 200 and not tries.spent)
                break
            except KeptAliveOnly as dropped:  # blank lines only so far: nothing of the answer is lost
                resp = await self.retrier.reopen(tries, send, dropped.error, request.receive)
        headers = ex.response_headers(resp)
        if resp.status_code == 401 and self.auth.managed:
            return self._upstream_refused_key(ex, family)
        if (ex.watch is not None or resp.status_code in KEPT_UPSTREAM) and \
                await self._learn(ex, family, resp.status_code, content):
            return self._confirmed(ex, family, resp.status_code, content)
        if resp.status_code != 200:
            if self.refusals is not None and resp.status_code in KEPT_UPSTREAM:
                self._keep_refusal(ex, resp.status_code, "deepseek", None, content)
            self.ledger.finish(ex, "upstream_error", resp.status_code, upstream_status=resp.status_code)
            return RawResponse(resp.status_code, headers, content, lines=ex.rate_headers)
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
        # spooled before anything is sent: a `kill -9` once the client has the answer cannot lose it
        self.ledger.finish(ex, "ok", 200, tokens, exact=exact, upstream_status=200,
                           calls=family.model_calls(answer), rule_code=ex.rule_note)
        return RawResponse(200, headers, content, lines=ex.rate_headers)

    async def _events(self, ex: Exchange, family: Family, answer: Answer, tries: Tries, send: SendOnce,
                      framer: EventFramer, turns: StreamTurns | None) -> AsyncGenerator[Piece, None]:
        """The stream's pieces for the client (relay.Relayed sends them), as DeepSeek's events arrive:
        what has arrived is taken at once, with one await per wait on DeepSeek (each bounded by the
        request's deadline, and announced by `WAIT`). Before the first data event, a failure is retried on
        the same client response (chatgate/gateway/retry.py). The usage record is made when DeepSeek's side
        ends, before the last event is yielded; in `finally` when the client went away first."""
        end: tuple[str, int] | None = None
        retries = self.retrier.policy.retries > 0
        try:
            while True:
                try:
                    while True:
                        raw = answer.ready()
                        if not raw:
                            if answer.at_eof():
                                break
                            yield WAIT
                            raw = await next_chunk(answer, tries.deadline)
                            if not raw:
                                break
                        chunk = framer.feed(raw)
                        if framer.final and end is None:
                            end = ("ok", 200)
                            await self._stream_ended(family, turns, framer.meter, ex, *end)
                        if chunk:
                            yield framer.piece(chunk)
                        if framer.final and framer.between:
                            break
                    if not framer.final:
                        if framer.pristine and retries:  # ended before its first event: no answer at all
                            raise KeptAliveOnly(bad_gateway(
                                "DeepSeek ended the stream before its first event (it sent only "
                                "keep-alives).", "upstream_bad_response"))
                        if rest := framer.rest():
                            yield framer.piece(rest)
                        # No final event: a stream DeepSeek ended with its own error event is its error.
                        framer.meter.finish()
                        end = ("upstream_error" if framer.meter.ended_with_error else "ok", 200)
                        await self._stream_ended(family, turns, framer.meter, ex, *end)
                    break
                except UPSTREAM_FAILURES as exc:
                    if not framer.pristine or not retries:
                        raise
                    error = exc.error if isinstance(exc, KeptAliveOnly) else map_transport_error(exc)
                    await answer.aclose()
                    framer.restart()
                    answer = await self.retrier.reopen(tries, send, error, None)  # Relayed watches
                    if not is_event_stream(answer.header("content-type") or ""):
                        raise bad_gateway("DeepSeek answered a streaming request with 200 but not an event "
                                          "stream (upstream broke the protocol).",
                                          "upstream_bad_response") from None
        except (APIError, KeptAliveOnly) as failed:  # the retries are spent, or the answer is unusable
            error = failed.error if isinstance(failed, KeptAliveOnly) else failed
            end = ("upstream_failed", error.status)
            await self._stream_ended(family, turns, framer.meter, ex, *end)
            yield framer.error_piece(error, started=False), False
        except TRANSPORT_FAILURES as exc:
            if not framer.final:
                error = map_transport_error(exc)
                end = ("upstream_failed", error.status)
                await self._stream_ended(family, turns, framer.meter, ex, *end)
                yield framer.error_piece(error, started=True), False
            elif framer.open_data:  # the last event lacked only its blank line
                yield framer.piece(b"\n")
        else:
            if framer.final:  # the client has it all: read the end of the body, so its connection is reused
                await drain(answer)
        finally:
            await answer.aclose()
            if not ex.finished:  # the client went away first (or the server is stopping)
                end = end or ("client_disconnected", 499)
                await self._stream_ended(family, turns, framer.meter, ex, *end)

    async def _stream_ended(self, family: Family, turns: StreamTurns | None, meter: StreamMeter, ex: Exchange,
                            outcome: str, status: int) -> None:
        """The upstream side of a stream has ended: remember its tool-call turn, make its record."""
        if ex.finished:
            return
        meter.finish()
        turn = turns.turn(lambda: meter.reasoning) if turns is not None and outcome == "ok" else None
        if turn is not None:
            await self.memory.remember(ex.identity.caller, family.turn_kind, turn, self._tenant(ex))
        if self.keep_text:
            ex.completion_text = meter.text
        if meter.model is not None:
            ex.model = ex.priced_as = meter.model[:MODEL_MAX_CHARS]
        if meter.usage is not None:
            self.ledger.finish(ex, outcome, status, meter.usage, upstream_status=200, calls=meter.calls,
                               rule_code=ex.rule_note)
            return
        tokens = await self.ledger.estimate(ex, functools.partial(family.prompt_text, ex.json()), meter.text,
                                            meter.reasoning, await self.media.tokens(ex, None))
        self.ledger.finish(ex, outcome, status, tokens, exact=False, upstream_status=200, calls=meter.calls,
                           rule_code=ex.rule_note)

    def _tenant(self, ex: Exchange) -> str:
        """Whose share of the reasoning memory a turn takes: its team's in managed mode (teams are made by
        the operator), its caller's in passthrough (every caller is in the one passthrough team)."""
        return ex.identity.team if self.auth.managed else ex.identity.caller

    # --- background work ----------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.background.spawn(coro)

    async def drain(self) -> None:
        await self.background.drain()
        if self.confirmations is not None:  # the warned rules' scores not written yet
            await self.confirmations.flush()
        if self.ledger.access_log is not None:
            self.ledger.access_log.flush()


def _disputed_text(problem: Problem, confirming: bool) -> str:
    """A refusing rule's problem as the warning of a request forwarded despite it (x-chatgate-warning: the
    client sees it only when DeepSeek accepted the request)."""
    if confirming:
        return (f"{problem.message} (chatgate's rule {problem.rule} refuses this; it was forwarded to "
                "confirm it with DeepSeek, which accepted it: the rule warns from now on, "
                "docs/confirmation.md)")
    return (f"{problem.message} (chatgate's rule {problem.rule} refuses this, but DeepSeek accepted such a "
            "request: the rule is disputed and warns, docs/confirmation.md)")


def _client_deadline(tries: Tries) -> float:
    """When a relayed answer's client must have taken all of it (the event loop's clock): the request's
    deadline, and a grace for the last events."""
    return asyncio.get_running_loop().time() + tries.deadline - time.perf_counter() + SLOW_CLIENT_GRACE_S


def _upload(route: Route) -> bool:
    """A tool API's multipart upload (OCR, ASR): its body is not JSON."""
    return route.tool is not None and route.tool.upload > 0
