"""The chat-completions handler: authenticate, read, validate, forward, meter.

Data flow: `Gateway.chat` -> `rules.check_body` -> `Upstream.send` -> (non-streaming) read the body and
meter its `usage`, or (streaming) hand the upstream response to `relay.SSERelay`. Every request that reaches
the handler ends in exactly one call to `Ledger.finish`, which writes the usage record.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from typing import Any

import httpx2
import orjson
from starlette.requests import Request
from starlette.responses import Response

from app.errors import APIError, Problem, bad_gateway
from app.gateway.auth import Authenticator
from app.gateway.bodies import origin_of, read_json_body, request_id_of
from app.gateway.exchange import Exchange, Route
from app.gateway.ledger import Ledger
from app.gateway.relay import SSERelay
from app.gateway.responses import RawResponse, error_response, is_event_stream, json_response
from app.gateway.upstream import Upstream, forward_headers, map_transport_error
from app.metering.metrics import Metrics
from app.metering.recorder import Recorder
from app.metering.tokens import context_overflow
from app.metering.usage import StreamMeter, tokens_from_usage
from app.openai.answers import StreamedTurn, turn_from_completion
from app.openai.repairs import message_index, reasoning_wanted, repair_chat, wanted
from app.openai.rules import Checked, Policy, check_body
from app.repair.base import Applied, Repaired
from app.repair.memory import TurnMemory
from app.settings import Settings

CHAT_TURNS = "chat"  # the kind of turn the chat family remembers (TurnMemory)
REPAIR_PASSES = 3

CHAT_ROUTES = {
    "/v1/chat/completions": Route("/v1/chat/completions", "/chat/completions"),
    "/chat/completions": Route("/chat/completions", "/chat/completions"),
    "/beta/chat/completions": Route("/beta/chat/completions", "/beta/chat/completions", beta=True),
    "/v1/beta/chat/completions": Route("/beta/chat/completions", "/beta/chat/completions", beta=True),
}


class Gateway:
    def __init__(self, settings: Settings, upstream: Upstream, recorder: Recorder | None,
                 auth: Authenticator, metrics: Metrics, memory: TurnMemory | None = None) -> None:
        self.settings = settings
        self.policy: Policy = settings.policy()
        self.profiles = dict(self.policy.profiles)
        self.upstream = upstream
        self.auth = auth
        self.metrics = metrics
        self.ledger = Ledger(settings, self.profiles, recorder, metrics)
        self.repairs = settings.repair.options()
        self.memory = memory or TurnMemory(None, settings.repair.reasoning_ttl_seconds,
                                           settings.repair.reasoning_cache_bytes)
        self.background: set[asyncio.Task[None]] = set()

    # --- entry points ---------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        route = CHAT_ROUTES[request.scope["path"]]
        request_id = request_id_of(request)
        try:
            identity = await self.auth.identify(request.headers.get("authorization"))
            body = await read_json_body(request, self.settings.limits.max_body_bytes)
        except APIError as error:
            self.ledger.refused(route.label, request_id, error.status, error.code, time.time())
            return error_response(error, request_id)
        ex = Exchange(route, request_id, identity, body=body)
        origin = origin_of(request)
        checked = self._check(ex, origin)
        if checked is not None and (checked.problems or checked.warnings) and self.repairs.enabled:
            checked = await self._repair(ex, checked, origin)
        if checked is not None and checked.problems:
            return self._reject(ex, self._refusal(ex, checked))
        if checked is not None and checked.warnings:
            ex.warnings.extend(w.message for w in checked.warnings)
        ex.remember = self._remembers(ex, checked)
        overflow = await self._context_guard(ex, checked)
        if overflow is not None and self.settings.validation.strict:
            return self._reject(ex, APIError.from_problems([overflow]))
        if overflow is not None:
            ex.warnings.append(overflow.message)
        try:
            return await self._forward(ex, request)
        except APIError as error:
            self.ledger.finish(ex, "upstream_failed", error.status, upstream_status=None)
            return error_response(error, request_id)

    async def validate_only(self, request: Request) -> Response:
        """The dry run: the same checks and repairs (reasoning is restored for the caller whose key is
        sent, if any); nothing is forwarded, nothing is metered."""
        route = Route(request.url.path, "", beta=request.url.path.startswith("/beta"))
        try:
            identity = await self.auth.identify(request.headers.get("authorization"))
        except APIError:
            identity = self.auth.anonymous()
        try:
            body = await read_json_body(request, self.settings.limits.max_body_bytes)
        except APIError as error:
            return error_response(error)
        ex = Exchange(route, request_id_of(request), identity, body=body)
        origin = origin_of(request)
        checked = check_body(body, self.policy, beta=route.beta, origin=origin)
        if (checked.problems or checked.warnings) and self.repairs.enabled:
            checked = await self._repair(ex, checked, origin)
        if checked.problems:
            return error_response(self._refusal(ex, checked))
        overflow = await self._context_guard(ex, checked)
        if overflow is not None and self.settings.validation.strict:
            return error_response(APIError.from_problems([overflow]))
        model = checked.request.model if checked.request else None
        warnings = [w.as_dict() for w in [*checked.warnings, *([overflow] if overflow else [])]]
        answer: dict[str, Any] = {"valid": True, "model": model, "warnings": warnings}
        if ex.repaired is not None and ex.repaired.applied:
            answer["repairs"] = [a.as_dict() for a in ex.repaired.applied]
            answer["repaired_body"] = ex.json()
        return json_response(200, answer)

    # --- steps -----------------------------------------------------------------------

    def _check(self, ex: Exchange, origin: str) -> Checked | None:
        if not self.settings.validation.enabled:
            hint = ex.json()
            ex.model, ex.stream = str(hint.get("model", "unknown"))[:200], hint.get("stream") is True
            return None
        checked = check_body(ex.body, self.policy, beta=ex.route.beta, origin=origin)
        if checked.request is not None:
            ex.model, ex.stream = checked.request.model, checked.request.stream is True
        else:
            ex.model = str(ex.json().get("model", "unknown"))[:200]
        return checked

    async def _context_guard(self, ex: Exchange, checked: Checked | None) -> Problem | None:
        """R40, when validation.context_guard is on: only bodies larger than the window are counted."""
        if not self.settings.validation.context_guard or checked is None or checked.request is None:
            return None
        request, profile = checked.request, checked.profile
        if profile is None or len(ex.body) <= profile.context_window:
            return None
        found = await asyncio.to_thread(context_overflow, ex.json(), len(ex.body), profile.context_window,
                                        request.max_tokens)
        if found is None:
            return None
        prompt, total = found
        return Problem("context_length_exceeded", "messages",
                       f"This model's maximum context length is {profile.context_window} tokens. However, "
                       f"you requested about {total} tokens ({prompt} in the messages by chatgate's count, "
                       f"{request.max_tokens or 0} in the completion). Please reduce the length of the "
                       "messages or completion.", "R40")

    # --- repairs ---------------------------------------------------------------------

    async def _repair(self, ex: Exchange, checked: Checked, origin: str) -> Checked:
        """Apply the enabled repairs that fix some of the problems found and check the result again, up to
        REPAIR_PASSES times (the sequence rules only run once the types are right, so fixing a role can
        reveal a dropped reasoning_content)."""
        applied: list[Applied] = []
        misses: dict[str, str] = {}
        for _ in range(REPAIR_PASSES):
            found = [*checked.problems, *checked.warnings]
            if not wanted(found, self.repairs) or not ex.json():
                break
            data = orjson.loads(ex.body)  # a fresh copy to change
            recalled, missed = await self._recall(ex, data, found)
            misses.update(missed)
            done = repair_chat(data, found, self.repairs, checked.profile, recalled)
            if not done:
                break
            applied += done
            body = orjson.dumps(data)
            ex.replace_body(body, data)
            checked = check_body(body, self.policy, beta=ex.route.beta, origin=origin)
        if applied or misses:
            ex.repaired = Repaired(applied, misses)
        if applied and checked.request is not None:
            ex.model, ex.stream = checked.request.model, checked.request.stream is True
        return checked

    async def _recall(self, ex: Exchange, data: dict[str, Any], found: list[Problem]
                      ) -> tuple[dict[int, str], dict[str, str]]:
        """restore_reasoning's look-up: the remembered reasoning of each assistant turn R17 names, if it
        is this caller's and its tool calls are the ones chatgate relayed; else why not (by call ids)."""
        indices = reasoning_wanted(found, self.repairs)
        if not indices:
            return {}, {}
        messages = data.get("messages") or []
        wanted_turns = {i: _calls_of(messages[i]) for i in indices if i < len(messages)}
        ttl = _duration(self.settings.repair.reasoning_ttl_seconds)
        if ex.identity.key_id == "anonymous":
            why = "chatgate restores reasoning only for callers that send a key"
            return {}, {",".join(ids): why for ids, _ in wanted_turns.values()}
        all_ids = [call_id for ids, _ in wanted_turns.values() for call_id in ids]
        rows = await self.memory.recall(ex.identity.key_id, CHAT_TURNS, all_ids)
        recalled: dict[int, str] = {}
        misses: dict[str, str] = {}
        for i, (ids, names) in wanted_turns.items():
            got = [rows.get(call_id) for call_id in ids]
            if ids and all(got) and len({r.turn for r in got if r}) == 1 and \
                    got[0] is not None and got[0].names == ",".join(names):
                recalled[i] = got[0].payload
                continue
            self.metrics.restore_misses.inc()
            misses[",".join(ids)] = (
                "the tool calls differ from the answer chatgate relayed with these ids" if any(got) else
                "it has no record of this turn for your key (it restores only the reasoning of answers it "
                f"relayed to the same key, for {ttl})")
        return recalled, misses

    def _refusal(self, ex: Exchange, checked: Checked) -> APIError:
        """The 400 for what is left, saying which R17 turns could not be restored and why."""
        problems = checked.problems
        repaired = ex.repaired
        if repaired is not None and repaired.notes:
            messages = ex.json().get("messages") or []
            problems = [self._with_miss(p, messages, repaired.notes) for p in problems]
        error = APIError.from_problems(problems)
        if repaired is not None and repaired.applied:
            error.repairs = [a.as_dict() for a in repaired.applied]
        return error

    @staticmethod
    def _with_miss(problem: Problem, messages: list[Any], notes: dict[str, str]) -> Problem:
        i = message_index(problem)
        if problem.code != "reasoning_content_missing" or i is None or i >= len(messages):
            return problem
        why = notes.get(",".join(_calls_of(messages[i])[0]))
        if why is None:
            return problem
        return dataclasses.replace(problem, message=f"{problem.message} chatgate could not restore it: "
                                                    f"{why}.")

    def _remembers(self, ex: Exchange, checked: Checked | None) -> bool:
        """Whether the answer's tool-call turn is worth remembering for restore_reasoning."""
        return (self.repairs.on("restore_reasoning") and checked is not None and checked.thinking
                and checked.request is not None and bool(checked.request.tools)
                and ex.identity.key_id != "anonymous")

    def _reject(self, ex: Exchange, error: APIError) -> Response:
        self.ledger.finish(ex, "rejected", 400, rule_code=error.code)
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
            tap = StreamedTurn() if ex.remember else None
            on_end = functools.partial(self._stream_ended, tap)
            return SSERelay(ex, resp, deadline, strip_usage, on_end, self.spawn, tap.feed if tap else None)
        return await self._buffered(ex, resp, deadline)

    def _upstream_body(self, ex: Exchange) -> tuple[bytes, bool]:
        """The client's bytes, unless chatgate must ask for streamed usage (re-serialised, fields kept)."""
        if not (ex.stream and self.settings.upstream.request_stream_usage):
            return ex.body, False
        data = ex.json()
        options = data.get("stream_options") or {}
        if not data or not isinstance(options, dict) or options.get("include_usage") is True:
            return ex.body, False  # asked already, or a body chatgate did not validate: leave it alone
        return orjson.dumps({**data, "stream_options": {**options, "include_usage": True}}), True

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
                self.ledger.finish, ex, "upstream_error", resp.status_code, upstream_status=resp.status_code))
        try:
            data = orjson.loads(content)
        except orjson.JSONDecodeError:
            raise bad_gateway("DeepSeek answered 200 with a body that is not JSON (upstream broke the "
                              "protocol).", "upstream_bad_response") from None
        tokens = tokens_from_usage(data.get("usage")) if isinstance(data, dict) else None
        if ex.remember and (turn := turn_from_completion(data)) is not None:
            await self.memory.remember(ex.identity.key_id, CHAT_TURNS, turn)  # before the client has it
        if self.settings.server.log_content:
            ex.completion_text = content.decode("utf-8", "replace")
        exact = tokens is not None
        if tokens is None:
            tokens = await self.ledger.estimate(ex, completion_text="")
        record = functools.partial(self.ledger.finish, ex, "ok", 200, tokens, exact=exact,
                                   upstream_status=200)
        return RawResponse(200, headers, content, record)

    async def _stream_ended(self, turns: StreamedTurn | None, ex: Exchange, meter: StreamMeter, outcome: str,
                            status: int) -> None:
        """The relay's one call when the upstream side of a stream has ended (before [DONE] is relayed):
        remember its tool-call turn, meter it."""
        if ex.finished:
            return
        if turns is not None and outcome == "ok" and (turn := turns.turn(meter.reasoning)) is not None:
            await self.memory.remember(ex.identity.key_id, CHAT_TURNS, turn)
        if self.settings.server.log_content:
            ex.completion_text = meter.text
        if meter.usage is not None:
            self.ledger.finish(ex, outcome, status, meter.usage, upstream_status=200)
            return
        tokens = await self.ledger.estimate(ex, meter.text, meter.reasoning)
        self.ledger.finish(ex, outcome, status, tokens, exact=False, upstream_status=200)

    # --- background work ----------------------------------------------------------------

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def drain(self) -> None:
        while self.background:
            await asyncio.gather(*list(self.background), return_exceptions=True)
        if self.ledger.access_log is not None:
            self.ledger.access_log.flush()


def _calls_of(message: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(ids, names) of an assistant message's tool calls."""
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    ids: list[str] = []
    names: list[str] = []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        ids.append(str(call.get("id", "")) if isinstance(call, dict) else "")
        names.append(str(function.get("name", "")) if isinstance(function, dict) else "")
    return tuple(ids), tuple(names)


def _duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)} min"
    return f"{seconds:g} s"


async def read_all(resp: httpx2.Response) -> bytes:
    """The body as sent; decoded only if DeepSeek compressed it although chatgate asked for identity."""
    if "content-encoding" in resp.headers:
        return await resp.aread()
    try:
        return resp.content  # a transport that answers with the body already read (MockTransport)
    except httpx2.ResponseNotRead:
        return b"".join([chunk async for chunk in resp.aiter_raw()])
