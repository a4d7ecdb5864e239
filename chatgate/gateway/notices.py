"""Notices: what is off in a request that its caller cannot act on (Claude Code's JSON `metadata.user_id`,
Codex's `namespace` tool). Sent back on every request, they would teach people to ignore
`x-chatgate-warning`; instead each is counted in /metrics (`chatgate_notices_total{route,code}`, every
request) and logged once per key, code and hour (per process).

One notice is also said to the client, once per key and hour, because only the client can act on it and it
costs money: Claude Code's default model (`claude-opus-*`) is served by DeepSeek as `deepseek-v4-pro`, 3-4x
the price of `deepseek-flash` (`pricier_model`, docs/claude-code.md#models)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from chatgate.bounded import BoundedDict
from chatgate.errors import Problem
from chatgate.metering.metrics import Metrics

log = logging.getLogger("chatgate")
WINDOW_SECONDS = 3600.0
MAX_REMEMBERED = 10_000  # (key, code) pairs; past that the one said longest ago is forgotten


class Notices:
    def __init__(self, metrics: Metrics, clock: Callable[[], float] = time.monotonic,
                 window: float = WINDOW_SECONDS) -> None:
        self.metrics = metrics
        self.clock = clock
        self.window = window
        self._said: BoundedDict[tuple[str, str], float] = BoundedDict(MAX_REMEMBERED)

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

    def say(self, route: str, key_id: str, problem: Problem) -> bool:
        """Count it; log it if it was not said to this key within the hour (then True)."""
        self.metrics.noticed(route, problem.code)
        now = self.clock()
        pair = (key_id, problem.code)
        last = self._said.get(pair)
        if last is not None and now - last < self.window:
            return False
        self._said[pair] = now
        self._said.touch(pair)
        log.warning("notice (said once per key and hour) key=%s route=%s code=%s rule=%s: %s", key_id, route,
                    problem.code, problem.rule, problem.message)
        return True

    def tell(self, route: str, key_id: str, problem: Problem) -> list[str]:
        """A notice the client is told too: its message as an x-chatgate-warning the first time in the hour
        for this key ([]: said already)."""
        return [problem.message] if self.say(route, key_id, problem) else []


PRICIER_MODEL = "pricier_model"
CHEAPER = "deepseek-flash"


def pricier_model(model: str, priced_as: str) -> Problem | None:
    """A Claude name DeepSeek serves as deepseek-v4-pro (Claude Code's default, `claude-opus-*`): the client
    may not know it pays pro's price."""
    if not model.startswith("claude") or priced_as != "deepseek-v4-pro":
        return None
    return Problem(PRICIER_MODEL, "model", (
        f"{model} is served by DeepSeek as deepseek-v4-pro, 3-4x the price of {CHEAPER}; for the cheaper "
        f"model set ANTHROPIC_MODEL={CHEAPER} (or claude --model sonnet, or /model in Claude Code). "
        "Said once per key and hour."), warning=True, notice=True)
