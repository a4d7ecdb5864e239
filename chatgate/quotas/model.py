"""The vocabulary of quotas: who a limit applies to, what a request asks for, why it is refused, and the
rate-limit state a client is told about in OpenAI's `x-ratelimit-*` headers."""

from __future__ import annotations

from dataclasses import dataclass

from chatgate.store.base import Hold, LimitRow

WINDOW = 60.0  # rpm and tpm count the last minute (a sliding window)


@dataclass(frozen=True, slots=True)
class Subject:
    """A team or a key, with the limits set for it."""

    scope: str  # "team" or "key"
    name: str
    limits: LimitRow

    @property
    def label(self) -> str:
        return f"{self.scope} {self.name}"


@dataclass(slots=True)  # not frozen: one per request, and a frozen __init__ pays a call per field
class Ask:
    """What one request reserves: an upper bound of its tokens and of its cost, settled when it ends."""

    request_id: str
    ts: float  # when the request started (its usage record's time): its budget period and price
    tokens: int
    cost_picousd: int
    expires_at: float  # a reservation left by a replica that died is dropped then


@dataclass(slots=True)
class RateInfo:
    """The tightest request and token limits over the caller's subjects, for the response headers."""

    limit_requests: int | None = None
    remaining_requests: int | None = None
    reset_requests: float = 0.0
    limit_tokens: int | None = None
    remaining_tokens: int | None = None
    reset_tokens: float = 0.0

    def take_requests(self, limit: int, remaining: int, reset: float) -> None:
        """A subject's request limit: the headers say the tightest of the request's subjects."""
        if self.remaining_requests is None or remaining < self.remaining_requests:
            self.limit_requests, self.remaining_requests, self.reset_requests = limit, remaining, reset

    def take_tokens(self, limit: int, remaining: int, reset: float) -> None:
        if self.remaining_tokens is None or remaining < self.remaining_tokens:
            self.limit_tokens, self.remaining_tokens, self.reset_tokens = limit, remaining, reset

    def headers(self) -> list[tuple[bytes, bytes]]:
        out = []
        reset = b""
        if self.limit_requests is not None:
            remaining = self.remaining_requests or 0
            reset = duration_bytes(self.reset_requests)
            out += [(b"x-ratelimit-limit-requests", b"%d" % self.limit_requests),
                    (b"x-ratelimit-remaining-requests", b"%d" % (remaining if remaining > 0 else 0)),
                    (b"x-ratelimit-reset-requests", reset)]
        if self.limit_tokens is not None:
            remaining = self.remaining_tokens or 0
            # one subject's rpm and tpm share their window's reset: formatted once
            if not reset or self.reset_tokens != self.reset_requests:
                reset = duration_bytes(self.reset_tokens)
            out += [(b"x-ratelimit-limit-tokens", b"%d" % self.limit_tokens),
                    (b"x-ratelimit-remaining-tokens", b"%d" % (remaining if remaining > 0 else 0)),
                    (b"x-ratelimit-reset-tokens", reset)]
        return out


@dataclass(frozen=True, slots=True)
class Refusal:
    kind: str  # rpm, tpm, concurrency, budget, unpriced, or unavailable (a backend down, fail_closed)
    subject: Subject | None
    limit: int
    retry_after: float | None  # seconds; None when waiting cannot help (the request alone is too big)
    message: str
    info: RateInfo | None = None  # the caller's rate-limit state, for the 429's headers

    @property
    def code(self) -> str:
        """The rule code of the usage record: which limit of whom (e.g. rpm:team)."""
        return f"{self.kind}:{self.subject.scope}" if self.subject is not None else self.kind


@dataclass(frozen=True, slots=True)
class Plan:
    """What a caller's limits ask of each request, worked out once per change of its limits."""

    subjects: list[Subject]
    rated: list[Subject]  # those with an rpm, tpm or max_concurrent
    budgeted: list[Subject]  # those with a budget
    foreign: Subject | None = None  # one whose budget is in another currency than the prices

    @staticmethod
    def of(subjects: list[Subject], currency: str = "USD") -> Plan:
        rated = [s for s in subjects if s.limits.rpm is not None or s.limits.tpm is not None
                 or s.limits.max_concurrent is not None]
        budgeted = [s for s in subjects if s.limits.budget_picousd is not None]
        foreign = next((s for s in budgeted if s.limits.budget_currency != currency), None)
        return Plan(subjects, rated, budgeted, foreign)


@dataclass(slots=True)
class Admission:
    """An admitted request's reservations, settled once when it ends."""

    ask: Ask
    subjects: list[Subject]
    holds: list[Hold]
    rated: list[Subject]  # the subjects whose rate and concurrency counters count it (until released)
    info: RateInfo | None = None  # the rate-limit state for the response headers, when a rate applies
    settled: bool = False


def duration(seconds: float) -> str:
    """OpenAI's style for x-ratelimit-reset-*: 20ms, 1.5s, 6m0s."""
    return duration_bytes(seconds).decode()


def duration_bytes(seconds: float) -> bytes:
    """`duration` as the header value (bytes formatting: no str made and encoded per header)."""
    if seconds < 1:
        return b"%dms" % round(seconds * 1000) if seconds > 0 else b"0ms"
    if seconds < 60:
        return b"%.3gs" % seconds
    minutes, rest = divmod(round(seconds), 60)
    return b"%dm%ds" % (minutes, rest)
