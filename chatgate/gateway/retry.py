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
from typing import Any, TypeVar

import orjson
from starlette.types import Receive

from chatgate.errors import APIError
from chatgate.gateway.accounts import Lease, Pool
from chatgate.gateway.upstream import Answer, ReadAnswer, read_whole
from chatgate.metering.metrics import Metrics
from chatgate.quotas.alerts import Alerts
from chatgate.settings import Settings, UpstreamSettings
from chatgate.tracing.spans import ExchangeTrace

# One attempt: the Authorization value to send (an account's key; None: the caller's, already in the headers).
SendOnce = Callable[[bytes | None], Awaitable[Answer]]
T = TypeVar("T")
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
    """One request's attempts: how many, since when, why each retry was made, and the account (its lease)
    of the last one. The exchange keeps it (`Exchange.tries`); its record reads the attempts and account."""

    policy: RetryPolicy
    deadline: float  # time.perf_counter() by which the request must be over
    team: str | None = None  # the caller's team: the accounts that may serve it
    files: bool = False  # it names uploaded files: only the account that holds them serves it
    trace: ExchangeTrace | None = None  # one span per attempt, when tracing is on
    started: float = field(default_factory=time.perf_counter)
    count: int = 0
    reasons: list[str] = field(default_factory=list)
    spent: bool = False  # chatgate gave up retrying: the final error says so
    lease: Lease | None = None  # the last attempt's account, until the exchange ends (`release`)
    account: str | None = None  # its name, for the record

    @property
    def attempts(self) -> int:
        return max(self.count, 1)

    def release(self) -> None:
        """The account's request is over (or failed): another may take its place."""
        if self.lease is not None:
            self.lease.release()
            self.lease = None

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

    async def race(self, awaitable: Awaitable[T]) -> T:
        """`awaitable`'s result, or ClientHungUp (and it cancelled) if the client goes away first."""
        if self._receive is None:  # the relay watches the client itself (it cancels this task)
            return await awaitable
        if self._task is None:
            self._task = asyncio.ensure_future(self._watch())
        work: asyncio.Future[T] = asyncio.ensure_future(awaitable)
        watch: asyncio.Future[None] = self._task
        done, _ = await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
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
        self._counters: dict[tuple[str, str], Any] = {}  # the attempts counter's children, by account, status
        self.max_bytes = max_bytes  # the most of an error answer read here (limits.max_upstream_bytes)

    def tries(self, deadline: float, team: str | None = None, files: bool = False,
              trace: ExchangeTrace | None = None) -> Tries:
        return Tries(self.policy, deadline, team, files, trace)

    async def open(self, tries: Tries, send: SendOnce, receive: Receive | None) -> Answer:
        """The answer the attempts ended with: a 200 (its body unread), DeepSeek's error for a status that
        is not retried (unread), or the last error once the retries are spent (read; its message says so).
        Raises the APIError of an unreachable DeepSeek once the retries are spent, ClientHungUp if the client
        goes away between attempts."""
        hangup = Hangup(receive)
        try:
            return await self._attempts(tries, send, hangup)
        finally:
            hangup.close()

    async def reopen(self, tries: Tries, send: SendOnce, failure: APIError, receive: Receive | None
                     ) -> Answer:
        """A new attempt after one that failed having sent only keep-alives (`failure`): a 200 to relay in
        its place, else the APIError to end the response with."""
        tries.release()
        wait = tries.wait(backoff(tries.count, self.policy.base_s, self.rng))
        if wait is None:
            raise self._spent(tries, failure)
        hangup = Hangup(receive)
        try:
            await self._retry(tries, hangup, "keepalive_drop", wait)
            answer = await self._attempts(tries, send, hangup)
        finally:
            hangup.close()
        if answer.status_code == 200:
            return answer
        content = await read_whole(answer, tries.deadline, self.max_bytes)
        raise error_of(answer.status_code, content, tries)

    async def _attempts(self, tries: Tries, send: SendOnce, hangup: Hangup) -> Answer:
        last: ReadAnswer | APIError | None = None
        while True:
            lease = None
            if self.pool is not None:
                taken = await self._lease(tries, hangup, last)
                if not isinstance(taken, Lease):
                    return taken
                lease = taken
            tries.count += 1
            tries.lease, tries.account = lease, lease.account.name if lease is not None else None
            authorization = lease.account.authorization if lease is not None else None
            try:
                answer = await (send(authorization) if tries.count == 1 else hangup.race(send(authorization)))
            except APIError as error:  # unreachable, refused, reset or timed out before the headers
                reason = "timeout" if error.status == 504 else "connect"
                tries.release()
                self._count(tries, reason)
                wait = tries.wait(backoff(tries.count, self.policy.base_s, self.rng))
                if wait is None:
                    raise self._spent(tries, error) from None
                last = error
                await self._retry(tries, hangup, reason, wait)
                continue
            status = answer.status_code
            self._count(tries, str(status))
            if status == 200:
                if lease is not None:
                    lease.succeeded()
                return answer
            if status not in self.policy.statuses:
                if lease is not None and status in (401, 402) and self._elsewhere(tries, lease):
                    # nothing was generated: the request goes to another account, this one is set aside
                    failed = rebuilt(answer, await read_whole(answer, tries.deadline, self.max_bytes))
                    assert self.pool is not None
                    self.pool.unavailable(lease.account, status, failed)
                    tries.release()
                    wait = tries.wait(0.0)
                    if wait is None:
                        return self._spent_answer(tries, failed)
                    last = failed
                    await self._retry(tries, hangup, str(status), wait)
                    continue
                if lease is not None and status in (401, 402):
                    assert self.pool is not None
                    self.pool.unavailable(lease.account, status)
                return answer
            failed = rebuilt(answer, await read_whole(answer, tries.deadline, self.max_bytes))
            said = retry_after(answer.header("retry-after"))  # the account is set aside for all of it
            after = min(said, self.policy.max_wait_s) if said is not None else None
            tries.release()
            wanted = after if after is not None else backoff(tries.count, self.policy.base_s, self.rng)
            if status == 429 and lease is not None and self.pool is not None:
                self.pool.rate_limited(lease.account, said, self.policy.base_s, failed)
                wanted = 0.0  # the retry goes to another account, or waits for one (_lease)
            wait = tries.wait(wanted)
            if wait is None:
                return self._spent_answer(tries, failed)
            last = failed
            await self._retry(tries, hangup, str(status), wait)

    async def _lease(self, tries: Tries, hangup: Hangup, last: ReadAnswer | APIError | None
                     ) -> Lease | ReadAnswer:
        """The account for the next attempt. While every account (of those that serve the caller's team) is
        set aside, wait for the first to come back within the retry budget; else DeepSeek's last error."""
        assert self.pool is not None
        team = tries.team
        if not tries.files and not self.pool.serving(team):
            raise APIError(503, f"No DeepSeek account of the pool serves team {team!r} (upstream.accounts: "
                           "every account is pinned to other teams).", "server_error", None,
                           "no_account_for_team")
        while True:
            lease = self.pool.acquire(tries.files, team)
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
                return self._spent_answer(tries, final) if tries.count else final
            await hangup.race(self.pool.wait(min(back, room)))

    async def _retry(self, tries: Tries, hangup: Hangup, reason: str, wait: float) -> None:
        if tries.trace is not None:  # the attempt's span ends here; the last one ends with the request
            tries.trace.attempt_failed(reason, int(reason) if reason.isdigit() else None)
        tries.reasons.append(reason)
        self.metrics.upstream_retries.labels(reason).inc()
        await hangup.sleep(wait)

    def _count(self, tries: Tries, status: str) -> None:
        """One attempt's outcome, by account ("caller": the caller's own key) and status or reason; its
        counter looked up once per pair."""
        key = (tries.account or "caller", status)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = self.metrics.upstream_attempts.labels(*key)
        counter.inc()

    def _elsewhere(self, tries: Tries, lease: Lease) -> bool:
        """Whether a 401 or 402 of `lease`'s account may send the request to another account: one serves its
        team (a request naming uploaded files has only the account that holds them)."""
        return self.pool is not None and not tries.files and self.pool.others(lease.account, tries.team)

    def _spent(self, tries: Tries, error: APIError) -> APIError:
        tries.spent = True
        if self.policy.retries:
            error.message = f"{error.message} ({tries.summary()}.)"
            error.headers["x-should-retry"] = "false"
        return error

    def _spent_answer(self, tries: Tries, answer: ReadAnswer) -> ReadAnswer:
        tries.spent = True
        headers = [(k, v) for k, v in answer.raw_headers if k.lower() != b"x-should-retry"]
        headers.append((b"x-should-retry", b"false"))
        return ReadAnswer(answer.status_code, headers, with_note(answer.content, tries.summary()))


def rebuilt(answer: Answer, content: bytes) -> ReadAnswer:
    """An answer whose body has been read (and closed), to relay or inspect later."""
    headers = [(k, v) for k, v in answer.raw_headers
               if k.lower() not in (b"content-length", b"content-encoding", b"transfer-encoding")]
    return ReadAnswer(answer.status_code, headers, content)


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
