"""Requests per minute, tokens per minute and requests in flight, counted in this process (one replica).

A sliding window of the last minute per subject. An admission checks every subject first and counts it in
all of them only if all have room (all or nothing); the token count reserved is replaced by the actual one
when the request ends, and the request leaves the in-flight count.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from app.quotas.model import WINDOW, Ask, RateInfo, Refusal, Subject


@dataclass(slots=True)
class Window:
    requests: deque[float] = field(default_factory=deque)
    entries: deque[list[float]] = field(default_factory=deque)  # [ts, tokens]
    tokens: float = 0.0
    in_flight: dict[str, list[float]] = field(default_factory=dict)  # request id -> its token entry

    def prune(self, now: float) -> None:
        edge = now - WINDOW
        while self.requests and self.requests[0] <= edge:
            self.requests.popleft()
        while self.entries and self.entries[0][0] <= edge:
            self.tokens -= self.entries.popleft()[1]


def check(window: Window, subject: Subject, ask: Ask, now: float, info: RateInfo) -> Refusal | None:
    """Whether `subject` has room for `ask`; fills `info` with what the headers report."""
    limits = subject.limits
    if limits.max_concurrent is not None and len(window.in_flight) >= limits.max_concurrent:
        return Refusal("concurrency", subject, limits.max_concurrent, 1.0,
                       f"Too many requests in flight for {subject.label}: {len(window.in_flight)} of "
                       f"{limits.max_concurrent} allowed at once. Retry when one has finished.")
    if limits.rpm is not None:
        used = len(window.requests)
        reset = window.requests[0] + WINDOW - now if window.requests else 0.0
        if used >= limits.rpm:
            info.take(limits.rpm, 0, reset, tokens=False)
            return Refusal("rpm", subject, limits.rpm, reset,
                           f"Rate limit reached for {subject.label}: {limits.rpm} requests per minute. "
                           f"Retry in {reset:.1f} s.")
        info.take(limits.rpm, limits.rpm - used - 1, reset, tokens=False)
    if limits.tpm is not None:
        reset = window.entries[0][0] + WINDOW - now if window.entries else 0.0
        if window.tokens + ask.tokens > limits.tpm:
            info.take(limits.tpm, int(limits.tpm - window.tokens), reset, tokens=True)
            wait = _tokens_free_in(window, limits.tpm - ask.tokens, now)
            too_big = ask.tokens > limits.tpm
            return Refusal("tpm", subject, limits.tpm, None if too_big else wait,
                           f"Rate limit reached for {subject.label}: {limits.tpm} tokens per minute; this "
                           f"request reserves up to {ask.tokens} (its prompt and max_tokens)."
                           + (" It can never fit: lower max_tokens." if too_big
                              else f" Retry in {wait:.1f} s."))
        info.take(limits.tpm, int(limits.tpm - window.tokens - ask.tokens), reset, tokens=True)
    return None


def _tokens_free_in(window: Window, room: float, now: float) -> float:
    """Seconds until the window holds at most `room` tokens."""
    total = window.tokens
    for ts, amount in window.entries:
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
        info = RateInfo()
        windows = []
        for subject in subjects:
            window = self._window(subject, now)
            refused = check(window, subject, ask, now, info)
            if refused is not None:
                return refused, info
            windows.append(window)
        for window, subject in zip(windows, subjects, strict=True):
            if subject.limits.rpm is not None:
                window.requests.append(now)
            entry = [now, float(ask.tokens)]
            if subject.limits.tpm is not None:
                window.entries.append(entry)
                window.tokens += ask.tokens
            window.in_flight[ask.request_id] = entry
        return None, info

    async def release(self, subjects: list[Subject], ask: Ask, tokens: int, cancel: bool = False) -> None:
        self.release_now(subjects, ask, tokens, cancel)

    def release_now(self, subjects: list[Subject], ask: Ask, tokens: int, cancel: bool = False) -> None:
        """The request has ended, having used `tokens`; with `cancel` it never went out: it does not count
        at all (its request and its tokens leave the window)."""
        for subject in subjects:
            window = self.windows.get((subject.scope, subject.name))
            entry = window.in_flight.pop(ask.request_id, None) if window is not None else None
            if window is None or entry is None:
                continue
            if cancel:
                if subject.limits.rpm is not None and entry[0] in window.requests:
                    window.requests.remove(entry[0])
                if subject.limits.tpm is not None:
                    for n, other in enumerate(window.entries):
                        if other is entry:
                            del window.entries[n]
                            window.tokens -= entry[1]
                            break
            elif subject.limits.tpm is not None:
                if window.entries and window.entries[0][0] <= entry[0]:  # not pruned yet: it still counts
                    window.tokens += tokens - entry[1]
                entry[1] = float(tokens)

    def _window(self, subject: Subject, now: float) -> Window:
        window = self.windows.get((subject.scope, subject.name))
        if window is None:
            window = self.windows[(subject.scope, subject.name)] = Window()
        window.prune(now)
        return window

    async def close(self) -> None:
        return None
