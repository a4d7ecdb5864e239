"""Requests per minute, tokens per minute and requests in flight, counted in this process (one replica).

A sliding window of the last minute per subject. An admission checks every subject first and counts it in
all of them only if all have room (all or nothing); the token count reserved is replaced by the actual one
when the request ends, and the request leaves the in-flight count.
"""

from __future__ import annotations

from array import array

from chatgate.quotas.model import WINDOW, Ask, RateInfo, Refusal, Subject
from chatgate.store.base import LimitRow

GONE = float("-inf")  # a cancelled request's start time: it no longer counts, and leaves at the next prune


class Window:
    """One subject's requests of the last minute, oldest first: their start times and tokens in a ring of
    doubles (no object per request: a subject at thousands of requests a minute holds 16 bytes for each),
    the totals, and the requests in flight (request id -> the position of its entry, -1 when none)."""

    __slots__ = ("amounts", "gone", "head", "in_flight", "mask", "tail", "times", "tokens")

    def __init__(self, capacity: int = 64) -> None:
        self.times = array("d", bytes(8 * capacity))
        self.amounts = array("d", bytes(8 * capacity))
        self.mask = capacity - 1  # a power of two
        self.head = self.tail = 0  # positions only grow; an entry lives at position & mask
        self.gone = 0  # cancelled entries still in the ring
        self.tokens = 0.0
        self.in_flight: dict[str, int] = {}

    @property
    def requests(self) -> int:
        return self.tail - self.head - self.gone

    def oldest(self) -> float | None:
        """The start time of the oldest entry that counts (after a prune the oldest one always does)."""
        return self.times[self.head & self.mask] if self.tail > self.head else None

    def fresh(self, now: float) -> None:
        """The window as of `now`: pruned only when an entry has left it."""
        if self.tail > self.head and self.times[self.head & self.mask] <= now - WINDOW:
            self.prune(now)

    def enter(self, limits: LimitRow, ask: Ask, now: float) -> None:
        """`ask` is in flight, and counted when a request or token limit applies."""
        counted = limits.rpm is not None or limits.tpm is not None
        self.in_flight[ask.request_id] = self.add(now, ask.tokens) if counted else -1

    def prune(self, now: float) -> None:
        edge, times, mask = now - WINDOW, self.times, self.mask
        while self.head < self.tail and times[self.head & mask] <= edge:
            if times[self.head & mask] == GONE:
                self.gone -= 1
            else:
                self.tokens -= self.amounts[self.head & mask]
            self.head += 1

    def add(self, ts: float, tokens: float) -> int:
        if self.tail - self.head > self.mask:
            self._grow()
        at = self.tail & self.mask
        self.times[at] = ts
        self.amounts[at] = tokens
        self.tokens += tokens
        self.tail += 1
        return self.tail - 1

    def settle(self, position: int, tokens: float) -> None:
        """The request at `position` used `tokens` (it counts with those while it is in the window)."""
        if position >= self.head:
            at = position & self.mask
            self.tokens += tokens - self.amounts[at]
            self.amounts[at] = tokens

    def cancel(self, position: int) -> None:
        """The request at `position` never went out: neither it nor its tokens count."""
        if position >= self.head:
            at = position & self.mask
            self.tokens -= self.amounts[at]
            self.times[at], self.amounts[at] = GONE, 0.0
            self.gone += 1

    def entries(self) -> list[tuple[float, float]]:
        """(start time, tokens) of each counted entry, oldest first."""
        return [(self.times[p & self.mask], self.amounts[p & self.mask]) for p in range(self.head, self.tail)
                if self.times[p & self.mask] != GONE]

    def _grow(self) -> None:
        """Twice the room, each entry at the same position (the ring is full: one rotation, two copies)."""
        size, start = 2 * (self.mask + 1), self.head & self.mask
        times, amounts = array("d", bytes(8 * size)), array("d", bytes(8 * size))
        for new, old in ((times, self.times), (amounts, self.amounts)):
            ordered = old[start:] + old[:start]  # oldest first
            at = self.head & (size - 1)
            first = min(len(ordered), size - at)
            new[at:at + first] = ordered[:first]
            new[:len(ordered) - first] = ordered[first:]
        self.times, self.amounts, self.mask = times, amounts, size - 1


def check(window: Window, subject: Subject, ask: Ask, now: float, info: RateInfo) -> Refusal | None:
    """Whether `subject` has room for `ask`; fills `info` with what the headers report."""
    limits = subject.limits
    if limits.max_concurrent is not None and len(window.in_flight) >= limits.max_concurrent:
        return Refusal("concurrency", subject, limits.max_concurrent, 1.0,
                       f"Too many requests in flight for {subject.label}: {len(window.in_flight)} of "
                       f"{limits.max_concurrent} allowed at once. Retry when one has finished.")
    rpm, tpm = limits.rpm, limits.tpm
    if rpm is None and tpm is None:
        return None
    head = window.head  # (`oldest`, inline: once per subject per request)
    reset = window.times[head & window.mask] + WINDOW - now if window.tail > head else 0.0
    if rpm is not None:
        used = window.requests
        if used >= rpm:
            info.take_requests(rpm, 0, reset)
            return Refusal("rpm", subject, rpm, reset,
                           f"Rate limit reached for {subject.label}: {rpm} requests per minute. "
                           f"Retry in {reset:.1f} s.")
        info.take_requests(rpm, rpm - used - 1, reset)
    if tpm is not None:
        if window.tokens + ask.tokens > tpm:
            info.take_tokens(tpm, int(tpm - window.tokens), reset)
            wait = _tokens_free_in(window, tpm - ask.tokens, now)
            too_big = ask.tokens > tpm
            return Refusal("tpm", subject, tpm, None if too_big else wait,
                           f"Rate limit reached for {subject.label}: {tpm} tokens per minute; this "
                           f"request reserves up to {ask.tokens} (its prompt and max_tokens)."
                           + (" It can never fit: lower max_tokens." if too_big
                              else f" Retry in {wait:.1f} s."))
        info.take_tokens(tpm, int(tpm - window.tokens - ask.tokens), reset)
    return None


def _tokens_free_in(window: Window, room: float, now: float) -> float:
    """Seconds until the window holds at most `room` tokens."""
    total = window.tokens
    for ts, amount in window.entries():
        if total <= room:
            break
        total -= amount
        wait = ts + WINDOW - now
        if total <= room:
            return max(wait, 0.0)
    return 0.0


class LocalRates:
    def __init__(self) -> None:
        self.windows: dict[tuple[str, str], Window] = {}

    async def acquire(self, subjects: list[Subject], ask: Ask, now: float
                      ) -> tuple[Refusal | None, RateInfo]:
        return self.acquire_now(subjects, ask, now)

    def acquire_now(self, subjects: list[Subject], ask: Ask, now: float) -> tuple[Refusal | None, RateInfo]:
        info = RateInfo()
        checked = []  # (window, limits); no zip(strict=True): its keyword is parsed on every call
        for subject in subjects:
            window = self._window(subject, now)
            refused = check(window, subject, ask, now, info)
            if refused is not None:
                return refused, info
            checked.append((window, subject.limits))
        for window, limits in checked:
            window.enter(limits, ask, now)
        return None, info

    async def release(self, subjects: list[Subject], ask: Ask, tokens: int, cancel: bool = False) -> None:
        self.release_now(subjects, ask, tokens, cancel)

    def release_now(self, subjects: list[Subject], ask: Ask, tokens: int, cancel: bool = False) -> None:
        """The request has ended, having used `tokens`; with `cancel` it never went out: it does not count
        at all (its request and its tokens leave the window)."""
        for subject in subjects:
            window = self.windows.get((subject.scope, subject.name))
            position = window.in_flight.pop(ask.request_id, -1) if window is not None else -1
            if window is None or position < 0:
                continue
            if cancel:
                window.cancel(position)
            else:
                window.settle(position, tokens)

    def window(self, subject: Subject) -> Window:
        """The subject's window, made on its first request (it is never replaced: it may be kept)."""
        return self.windows.get((subject.scope, subject.name)) or self.windows.setdefault(
            (subject.scope, subject.name), Window())

    def _window(self, subject: Subject, now: float) -> Window:
        window = self.window(subject)
        window.fresh(now)
        return window

    async def close(self) -> None:
        return None
