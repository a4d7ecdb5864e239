"""What an attack costs everyone else: while it runs, `Beside` asks chatgate's /healthz over and over and
relays streams from the fake DeepSeek (an event every STREAM_DELAY s), and keeps the worst /healthz round
trip, the worst gap between two events of a stream, and the most memory the process gained (chatgate runs in
the test's process, tests/harness.py). Issue 34's stall tests assert bounds on these.

The clients run in a process of their own (`python -m tests.stalls URL KEY PATH`, until its stdin closes):
in the test's process they would wait for the interpreter lock with the server they measure, and miss the
stalls they are there to see.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import httpx2

from tests import lifeline
from tests.harness import REPO_ROOT

STREAM_DELAY = 0.05  # seconds between the fake's events
# The pass line of the stall tests: added latency of /healthz and of a stream's events while an attack runs.
# Generous: the machine is shared (2 cores, up to 8 jobs); without the fixes the attacks stall 5 s or more.
BOUND_S = 2.0


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


class Beside:
    def __init__(self, url: str, key: str = "sk-test-client-0001", path: str = "/v1/chat/completions"
                 ) -> None:
        self.url, self.key, self.path = url, key, path
        self.healthz: list[float] = []
        self.gaps: list[float] = []
        self.errors: list[str] = []
        self.rss0 = rss_bytes()
        self.rss_peak = self.rss0
        self._stop = threading.Event()
        self._memory = threading.Thread(target=self._watch_memory, daemon=True)
        self._clients: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Beside:
        self._memory.start()
        command = [sys.executable, "-m", "tests.stalls", self.url, self.key, self.path]
        self._clients = lifeline.Popen(command, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self._clients.stdout is not None
        assert self._clients.stdout.readline().strip() == b"started", "the clients did not start"
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._memory.join(5)
        assert self._clients is not None
        out, _ = self._clients.communicate(timeout=120)  # closing stdin stops them
        seen = json.loads(out)
        self.healthz, self.gaps, self.errors = seen["healthz"], seen["gaps"], seen["errors"]

    @property
    def worst_healthz(self) -> float:
        return max(self.healthz, default=0.0)

    @property
    def worst_gap(self) -> float:
        return max(self.gaps, default=0.0)

    @property
    def memory_gained(self) -> int:
        return self.rss_peak - self.rss0

    def report(self) -> str:
        return (f"healthz worst {self.worst_healthz:.3f} s over {len(self.healthz)}, stream gap worst "
                f"{self.worst_gap:.3f} s over {len(self.gaps)}, memory +{self.memory_gained >> 20} MB, "
                f"errors {self.errors[:3]}")

    def assert_unstalled(self, bound: float = BOUND_S) -> None:
        assert not self.errors, self.report()
        assert self.healthz and self.gaps, self.report()
        assert self.worst_healthz < bound, self.report()
        assert self.worst_gap < bound + STREAM_DELAY, self.report()

    def _watch_memory(self) -> None:
        while not self._stop.is_set():
            self.rss_peak = max(self.rss_peak, rss_bytes())
            self._stop.wait(0.05)


class Clients:
    """The measuring side, in its own process."""

    def __init__(self, url: str, key: str, path: str) -> None:
        self.url, self.key, self.path = url, key, path
        self.healthz: list[float] = []
        self.gaps: list[float] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        loops = (self._ask_health, self._stream)
        threads = [threading.Thread(target=self._guard(f), daemon=True) for f in loops]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while (not self.healthz or not self.gaps) and time.monotonic() < deadline and not self.errors:
            time.sleep(0.01)
        print("started", flush=True)
        sys.stdin.read()
        self.stop.set()
        for t in threads:
            t.join(60)
        print(json.dumps({"healthz": self.healthz, "gaps": self.gaps, "errors": self.errors}), flush=True)

    def _guard(self, loop: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                loop()
            except Exception as exc:  # reported by assert_unstalled
                if not self.stop.is_set():
                    self.errors.append(repr(exc))
        return run

    def _ask_health(self) -> None:
        with httpx2.Client(timeout=120) as client:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                assert client.get(self.url + "/healthz").status_code == 200
                self.healthz.append(time.perf_counter() - t0)
                self.stop.wait(0.02)

    def _stream(self) -> None:
        body: dict[str, Any] = {"model": "deepseek-flash", "stream": True,
                                "messages": [{"role": "user", "content": "stream beside an attack"}]}
        headers = {"authorization": f"Bearer {self.key}", "x-fake-chunk-delay": str(STREAM_DELAY)}
        with httpx2.Client(timeout=120) as client:
            while not self.stop.is_set():
                with client.stream("POST", self.url + self.path, json=body, headers=headers) as resp:
                    assert resp.status_code == 200, resp.read()
                    last = None
                    for _ in resp.iter_lines():
                        now = time.perf_counter()
                        if last is not None:
                            self.gaps.append(now - last)
                        last = now


if __name__ == "__main__":
    Clients(*sys.argv[1:4]).run()
