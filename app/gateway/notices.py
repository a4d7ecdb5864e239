"""Notices: what is off in a request that its caller cannot act on (Claude Code's JSON `metadata.user_id`,
Codex's `namespace` tool). Sent back on every request, they would teach people to ignore
`x-chatgate-warning`; instead each is counted in /metrics (`chatgate_notices_total{route,code}`, every
request) and logged once per key, code and hour (per process)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from app.errors import Problem
from app.metering.metrics import Metrics

log = logging.getLogger("chatgate")
WINDOW_SECONDS = 3600.0
MAX_REMEMBERED = 10_000  # (key, code) pairs; past that the oldest hour is forgotten wholesale


class Notices:
    def __init__(self, metrics: Metrics, clock: Callable[[], float] = time.monotonic,
                 window: float = WINDOW_SECONDS) -> None:
        self.metrics = metrics
        self.clock = clock
        self.window = window
        self._said: dict[tuple[str, str], float] = {}

    def warnings(self, route: str, key_id: str, found: Iterable[Problem]) -> list[str]:
        """The messages of `found` to send back as x-chatgate-warning; the notices among them are said
        here instead."""
        out = []
        for problem in found:
            if problem.notice:
                self.say(route, key_id, problem)
            else:
                out.append(problem.message)
        return out

    def say(self, route: str, key_id: str, problem: Problem) -> None:
        self.metrics.noticed(route, problem.code)
        now = self.clock()
        pair = (key_id, problem.code)
        last = self._said.get(pair)
        if last is not None and now - last < self.window:
            return
        if len(self._said) >= MAX_REMEMBERED:
            self._said = {k: t for k, t in self._said.items() if now - t < self.window}
            if len(self._said) >= MAX_REMEMBERED:
                self._said.clear()
        self._said[pair] = now
        log.warning("notice (said once per key and hour) key=%s route=%s code=%s rule=%s: %s", key_id, route,
                    problem.code, problem.rule, problem.message)
