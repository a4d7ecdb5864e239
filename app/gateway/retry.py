"""Retrying DeepSeek before the first data event (docs/retries.md).

An attempt is retried when DeepSeek refuses or drops the connection, does not answer in time, answers with one
of `upstream.retry_statuses`, or, after only keep-alives (`: keep-alive` comments on a stream, blank lines
before a JSON body), drops the request: nothing of an answer has reached the client then, so a new attempt
can be relayed on the same client response. Each wait is DeepSeek's Retry-After, else an exponential back-off
with full jitter; no attempt starts later than `upstream.retry_max_wait_s` after the first one, nor past the
request's deadline. When chatgate gives up, its error says so (`x-should-retry: false`, so the SDKs do not
multiply the attempts, and a message with the attempts and the time spent).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx2
import orjson
from starlette.types import Receive

from app.errors import APIError
from app.gateway.accounts import Lease, Pool
from app.gateway.upstream import aiohttp_reader, map_transport_error, read_whole, too_large
from app.metering.metrics import Metrics
from app.quotas.alerts import Alerts
from app.settings import Settings, UpstreamSettings

# One attempt: the Authorization value to send (an account's key; None: the caller's, already in the headers).
SendOnce = Callable[[bytes | None], Awaitable[httpx2.Response]]
TRANSPORT_ERRORS = (TimeoutError, httpx2.TransportError, aiohttp.ClientError, OSError)
KEEPALIVE_STARTS = frozenset((b"", b":", b"\n", b"\r", b" ", b"\t"))


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    retries: int
    statuses: frozenset[int]
    base_s: float
    max_wait_s: float

    @classmethod
    def of(cls, settings: UpstreamSettings) -> RetryPolicy:
        statuses = frozenset(settings.retry_statuses) if settings.retries else frozenset()
        return cls(settings.retries, statuses, settings.retry_base_ms / 1000, settings.retry_max_wait_s)


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After value (delta-seconds or an HTTP date); None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


def backoff(attempts: int, base_s: float, rng: Callable[[], float] = random.random) -> float:
    """Full jitter: a uniform wait in [0, base * 2^(attempts-1)] after `attempts` failed attempts."""
    return float(rng() * base_s * 2 ** max(attempts - 1, 0))


@dataclass(slots=True)
class Tries:
    """One request's attempts: how many, since when, and why each retry was made."""

    policy: RetryPolicy
    deadline: float  # time.perf_counter() by which the request must be over
    started: float = field(default_factory=time.perf_counter)
    count: int = 0
    reasons: list[str] = field(default_factory=list)
    spent: bool = False  # chatgate gave up retrying: the final error says so

    def wait(self, wanted: float) -> float | None:
        """`wanted` seconds if another attempt may start after them; None if the attempts are used up or the
        wait would end outside the retry budget or the request's deadline."""
        if self.count > self.policy.retries:
            return None
        end = time.perf_counter() + wanted
        if end > self.started + self.policy.max_wait_s or end >= self.deadline:
            return None
        return wanted

    def room(self) -> float:
        """Seconds left in which another attempt may start (0: none may)."""
        if self.count > self.policy.retries:
            return 0.0
        now = time.perf_counter()
        return max(min(self.started + self.policy.max_wait_s, self.deadline) - now, 0.0)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def summary(self) -> str:
        return f"chatgate made {self.count} attempts over {self.elapsed():.1f} s"


class KeptAliveOnly(Exception):
    """The upstream failed after only keep-alives: nothing of the answer was received, a retry may follow."""

    def __init__(self, error: APIError) -> None:
        super().__init__(error.message)
        self.error = error


class ClientHungUp(Exception):
    """The client went away while chatgate waited to retry: nothing more is sent upstream for it."""


class Hangup:
    """Notices the client's disconnect while chatgate waits between attempts (the body has been read, so
    the next ASGI message is the disconnect). Started only once a retry is needed: no cost otherwise."""

    def __init__(self, receive: Receive | None) -> None:
        self._receive = receive
        self._task: asyncio.Task[None] | None = None

    async def _watch(self) -> None:
        assert self._receive is not None
        while (await self._receive())["type"] != "http.disconnect":
            pass

    async def race(self, awaitable: Awaitable[Any]) -> Any:
        """`awaitable`'s result, or ClientHungUp (and it cancelled) if the client goes away first."""
        if self._receive is None:  # the relay watches the client itself (it cancels this task)
            return await awaitable
        if self._task is None:
            self._task = asyncio.ensure_future(self._watch())
        work = asyncio.ensure_future(awaitable)
        done, _ = await asyncio.wait({work, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if work in done:
            return work.result()
        work.cancel()
        with contextlib.suppress(BaseException):  # the attempt's own outcome no longer matters
            await work
        raise ClientHungUp()

    async def sleep(self, seconds: float) -> None:
        if seconds > 0:
            await self.race(asyncio.sleep(seconds))
        elif self._task is not None and self._task.done():
            raise ClientHungUp()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


class Retrier:
    def __init__(self, policy: RetryPolicy, pool: Pool | None, metrics: Metrics, max_bytes: int | None = None,
                 rng: Callable[[], float] = random.random) -> None:
        self.policy = policy
        self.pool = pool
        self.metrics = metrics
        self.rng = rng
        self._answered: dict[tuple[str, int], Any] = {}  # the attempts counter's children, by account, status
        self.max_bytes = max_bytes  # the most of an error answer read here (limits.max_upstream_bytes)

    def tries(self, deadline: float) -> Tries:
        return Tries(self.policy, deadline)

    async def open(self, ex: Any, send: SendOnce, receive: Receive | None) -> httpx2.Response:
        """DeepSeek's answer to the exchange's request: a 200 (its body unread), DeepSeek's error for a status
        that is not retried (unread), or the last error once the retries are spent (read; its message says
        so). Raises the APIError of an unreachable DeepSeek once the retries are spent, ClientHungUp if the
        client goes away between attempts."""
        first: httpx2.Response | APIError | None = None
        if self.pool is None:  # the common case, one attempt that answers: no more than it costs
            tries: Tries = ex.tries
            tries.count = 1
            try:
                first = await send(None)
            except APIError as error:
                first = error
            else:
                if first.status_code not in self.policy.statuses:
                    self._count_answer("caller", first.status_code)
                    return first
        first_lease = None
        team = ex.identity.team
        if self.pool is not None and (first_lease := self.pool.acquire(ex.files, team)) is not None:
            # managed mode's common case, one account that answers: no retry loop around it
            tries = ex.tries
            tries.count = ex.attempts = 1
            ex.lease, ex.account = first_lease, first_lease.account.name
            try:
                first = await send(first_lease.account.authorization)
            except APIError as error:
                first = error
            else:
                status = first.status_code
                if status not in self.policy.statuses and not (
                        status in (401, 402) and self._elsewhere(ex, first_lease)):
                    self._count_answer(first_lease.account.name, status)
                    if status == 200:
                        first_lease.succeeded()
                    elif status in (401, 402):
                        self.pool_unavailable(first_lease, status, first)
                    return first
        hangup = Hangup(receive)
        try:
            return await self._attempts(ex, send, hangup, first, first_lease)
        finally:
            hangup.close()

    async def reopen(self, ex: Any, send: SendOnce, failure: APIError, receive: Receive | None
                     ) -> httpx2.Response:
        """A new attempt after one that failed having sent only keep-alives (`failure`): a 200 to relay in
        its place, else the APIError to end the response with."""
        tries: Tries = ex.tries
        self._release(ex)
        wait = tries.wait(backoff(tries.count, self.policy.base_s, self.rng))
        if wait is None:
            raise self._spent(tries, failure)
        hangup = Hangup(receive)
        try:
            await self._retry(ex, hangup, "keepalive_drop", wait)
            resp = await self._attempts(ex, send, hangup)
        finally:
            hangup.close()
        if resp.status_code == 200:
            return resp
        content = await read_whole(resp, tries.deadline, self.max_bytes)
        raise error_of(resp.status_code, content, tries)

    async def _attempts(self, ex: Any, send: SendOnce, hangup: Hangup,
                        first: httpx2.Response | APIError | None = None, first_lease: Lease | None = None
                        ) -> httpx2.Response:
        """The attempts (`first`: the first one's outcome when `open` made it already, `first_lease` its
        account's lease)."""
        tries: Tries = ex.tries
        last: httpx2.Response | APIError | None = None
        while True:
            lease, first_lease = first_lease, None
            if first is None:
                taken = await self._lease(tries, hangup, last, ex.files, ex.identity.team)
                if isinstance(taken, httpx2.Response):
                    return taken
                lease = taken
                tries.count += 1
                ex.attempts = tries.count
                ex.lease = lease
                ex.account = lease.account.name if lease is not None else None
            authorization = lease.account.authorization if lease is not None else None
            try:
                if first is not None:
                    outcome, first = first, None
                    if isinstance(outcome, APIError):
                        raise outcome
                    resp = outcome
                else:
                    resp = await (send(authorization) if tries.count == 1
                                  else hangup.race(send(authorization)))
            except APIError as error:  # unreachable, refused, reset or timed out before the headers
                reason = "timeout" if error.status == 504 else "connect"
                self._release(ex)
                self._count(ex, lease, reason)
                wait = tries.wait(backoff(tries.count, self.policy.base_s, self.rng))
                if wait is None:
                    raise self._spent(tries, error) from None
                last = error
                await self._retry(ex, hangup, reason, wait)
                continue
            status = resp.status_code
            self._count(ex, lease, str(status))
            if status == 200:
                if lease is not None:
                    lease.succeeded()
                return resp
            if status not in self.policy.statuses:
                if lease is not None and status in (401, 402) and self._elsewhere(ex, lease):
                    # nothing was generated: the request goes to another account, this one is set aside
                    failed = rebuilt(resp, await read_whole(resp, tries.deadline, self.max_bytes))
                    assert self.pool is not None
                    self.pool.unavailable(lease.account, status, failed)
                    self._release(ex)
                    wait = tries.wait(0.0)
                    if wait is None:
                        return self._spent_response(tries, failed)
                    last = failed
                    await self._retry(ex, hangup, str(status), wait)
                    continue
                if lease is not None and status in (401, 402):
                    self.pool_unavailable(lease, status, resp)
                return resp
            content = await read_whole(resp, tries.deadline, self.max_bytes)
            said = retry_after(resp.headers.get("retry-after"))  # the account is set aside for all of it
            after = min(said, self.policy.max_wait_s) if said is not None else None
            failed = rebuilt(resp, content)
            self._release(ex)
            wanted = after if after is not None else backoff(tries.count, self.policy.base_s, self.rng)
            if status == 429 and lease is not None and self.pool is not None:
                self.pool.rate_limited(lease.account, said, self.policy.base_s, failed)
                wanted = 0.0  # the retry goes to another account, or waits for one (_lease)
            wait = tries.wait(wanted)
            if wait is None:
                return self._spent_response(tries, failed)
            last = failed
            await self._retry(ex, hangup, str(status), wait)

    async def _lease(self, tries: Tries, hangup: Hangup, last: httpx2.Response | APIError | None,
                     files: bool = False, team: str | None = None) -> Lease | httpx2.Response | None:
        """The account for the next attempt (None: passthrough, the caller's key). While every account (of
        those that serve `team`) is set aside, wait for the first to come back within the retry budget; else
        DeepSeek's last error."""
        if self.pool is None:
            return None
        if not files and not self.pool.serving(team):
            raise APIError(503, f"No DeepSeek account of the pool serves team {team!r} (upstream.accounts: "
                           "every account is pinned to other teams).", "server_error", None,
                           "no_account_for_team")
        while True:
            lease = self.pool.acquire(files, team)
            if lease is not None:
                return lease
            back = max(self.pool.next_free(team) - time.monotonic(), 0.0) + 0.001
            room = tries.room()
            # the first account back (or one waiting for a request of its own to end) is too late: give up
            if room <= 0.001 or (back > room and not self.pool.awaiting_release(team)):
                final = last if last is not None else self.pool.last_error(team)
                if isinstance(final, APIError):
                    raise self._spent(tries, final)
                if final is None:
                    raise self._spent(tries, APIError(503, "Every DeepSeek account is set aside.",
                                                      "server_error", None, "accounts_unavailable"))
                return self._spent_response(tries, final) if tries.count else final
            await hangup.race(self.pool.wait(min(back, room)))

    async def _retry(self, ex: Any, hangup: Hangup, reason: str, wait: float) -> None:
        tries: Tries = ex.tries
        if ex.trace is not None:  # the attempt's span ends here; the last one ends with the request
            ex.trace.attempt_failed(reason, int(reason) if reason.isdigit() else None)
        tries.reasons.append(reason)
        self.metrics._child(self.metrics.upstream_retries, reason).inc()
        await hangup.sleep(wait)

    def _count_answer(self, account: str, status: int) -> None:
        """`_count` for a first attempt that answered: its counter looked up once per account and status (no
        str(status) and no key of the metrics' own per request)."""
        counter = self._answered.get((account, status))
        if counter is None:
            counter = self._answered[(account, status)] = self.metrics._child(self.metrics.upstream_attempts,
                                                                              account, str(status))
        counter.inc()

    def _count(self, ex: Any, lease: Lease | None, status: str) -> None:
        account = lease.account.name if lease is not None else (ex.account or "caller")
        self.metrics._child(self.metrics.upstream_attempts, account, status).inc()

    @staticmethod
    def _release(ex: Any) -> None:
        if ex.lease is not None:
            ex.lease.release()
            ex.lease = None

    def pool_unavailable(self, lease: Lease, status: int, resp: httpx2.Response) -> None:
        assert self.pool is not None
        self.pool.unavailable(lease.account, status)

    def _elsewhere(self, ex: Any, lease: Lease) -> bool:
        """Whether a 401 or 402 of `lease`'s account may send the request to another account: one serves its
        team (a request naming uploaded files has only the account that holds them)."""
        return self.pool is not None and not ex.files and self.pool.others(lease.account, ex.identity.team)

    def _spent(self, tries: Tries, error: APIError) -> APIError:
        tries.spent = True
        if self.policy.retries:
            error.message = f"{error.message} ({tries.summary()}.)"
            error.headers["x-should-retry"] = "false"
        return error

    def _spent_response(self, tries: Tries, resp: httpx2.Response) -> httpx2.Response:
        tries.spent = True
        headers = [(k, v) for k, v in resp.headers.raw if k.lower() != b"x-should-retry"]
        headers.append((b"x-should-retry", b"false"))
        return httpx2.Response(resp.status_code, headers=headers,
                               content=with_note(resp.content, tries.summary()))


def rebuilt(resp: httpx2.Response, content: bytes) -> httpx2.Response:
    """An answer whose body has been read (and closed), to relay or inspect later."""
    headers = [(k, v) for k, v in resp.headers.raw
               if k.lower() not in (b"content-length", b"content-encoding", b"transfer-encoding")]
    return httpx2.Response(resp.status_code, headers=headers, content=content)


def with_note(content: bytes, note: str) -> bytes:
    """DeepSeek's error body with chatgate's note appended to its message (OpenAI's and Anthropic's shapes
    both keep it in `error.message`); any other body as it came."""
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        return content
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return content
    error["message"] = f"{error['message']} ({note}.)"
    return orjson.dumps(data)


def error_of(status: int, content: bytes, tries: Tries) -> APIError:
    """DeepSeek's error as chatgate's own (to end a stream that had sent only keep-alives with)."""
    message = f"DeepSeek answered {status}"
    try:
        data = orjson.loads(content)
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            message = error["message"]
    except orjson.JSONDecodeError:
        pass
    tries.spent = True
    kind = ("server_error" if status >= 500 else "rate_limit_error" if status == 429
            else "invalid_request_error")
    return APIError(status, f"{message} ({tries.summary()}.)", kind, None, "upstream_error",
                    headers={"x-should-retry": "false"})


async def read_answer(resp: httpx2.Response, deadline: float, retryable: bool, limit: int | None = None
                      ) -> bytes:
    """A non-streaming answer's whole body, as `read_whole` (at most `limit` bytes); when `retryable`, a
    failure after nothing but blank lines (DeepSeek's keep-alives for a queued request) raises KeptAliveOnly
    instead."""
    if not retryable or "content-encoding" in resp.headers:
        return await read_whole(resp, deadline, limit)
    reader = aiohttp_reader(resp)  # read under httpx2's stream wrapper when it is aiohttp's
    if reader is None:
        try:
            return resp.content  # a transport that answers with the body already read
        except httpx2.ResponseNotRead:
            pass
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(max(deadline - time.perf_counter(), 0.001)):
            if reader is not None:
                while chunk := await reader.readany():
                    chunks.append(chunk)
                    size += len(chunk)
                    if limit is not None and size > limit:
                        raise too_large(limit)
            else:
                async for chunk in resp.aiter_raw():
                    chunks.append(chunk)
                    size += len(chunk)
                    if limit is not None and size > limit:
                        raise too_large(limit)
    except TRANSPORT_ERRORS as exc:
        error = map_transport_error(exc)
        if all(not chunk.strip() for chunk in chunks):
            raise KeptAliveOnly(error) from None
        raise error from None
    finally:
        await resp.aclose()
    content = b"".join(chunks)
    if not content.strip():  # the connection closed after only keep-alives: no answer at all
        raise KeptAliveOnly(APIError(502, "DeepSeek closed the connection before answering (it sent only "
                                     "keep-alives).", "server_error", None, "upstream_bad_response"))
    return content


def only_keepalives(data: bytes) -> bool:
    """Whether these stream bytes (a last line may be incomplete) are SSE comments and blank lines only."""
    if data[:1] not in KEEPALIVE_STARTS:  # the common case: the first chunk opens with an event
        return False
    for line in data.split(b"\n"):
        stripped = line.strip()
        if stripped and not stripped.startswith(b":"):
            return False
    return True


def retrying(settings: Settings, metrics: Metrics, alerts: Alerts | None) -> Retrier:
    """The retrier, and its managed-mode pool of accounts (watched by the metrics, told to the webhook)."""
    pool = Pool.from_settings(settings, on_unavailable=alerts.account_unavailable if alerts else None)
    if pool is not None:
        metrics.watch_accounts(pool.states)
    return Retrier(RetryPolicy.of(settings.upstream), pool, metrics, settings.limits.max_upstream_bytes)
