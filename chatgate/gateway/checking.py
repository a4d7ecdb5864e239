"""A body's checks (R1 as DeepSeek reads JSON, then the family's rules), run where they cost the others
least: on the event loop for an ordinary body, in a checker process above OFF_LOOP_BYTES.

Not on a thread: pydantic-core's and jiter's parses keep the interpreter lock for their whole length, and so
does the garbage collector walking the millions of objects a large body becomes: beside the check of a
large body on a thread, every other request waits for its whole length (docs/performance.md). A checker
process costs the loop the copy of the body into a pipe; what comes back is the verdict without the validated
request (the in-place restore, which reads it, then takes the general repair path).

The pool (CHECKERS processes, one core short of the cores chatgate may use, at most 4) starts with the first
large body; the cores it may use are the machine's, fewer where the CPU affinity or a container's CPU limit
(cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us`) says so: `usable_cpus`. A large body waits for a free
checker. If a checker cannot be used (it died), the check runs on a thread, as a last resort.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import math
import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, TypeVar

from chatgate.gateway.family import Family
from chatgate.gateway.strict import parse_strictly
from chatgate.settings import Settings
from chatgate.verdict import Rules, Verdict

OFF_LOOP_BYTES = 1024 * 1024  # the largest body checked on the loop
# A body this large starts the checker processes, if they are not running, while it is checked here: a
# conversation that grows past it is likely to pass OFF_LOOP_BYTES, whose first body would otherwise wait
# for a new interpreter to import chatgate (the pool's processes are spawned).
WARM_BYTES = OFF_LOOP_BYTES // 4


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cgroup_cpu_limit(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> float | None:
    """The CPU limit of this process's cgroup, in cores (a quota of 150000 per 100000 µs: 1.5), or None.

    cgroup v2: `cpu.max` ("max 100000" or "<quota> <period>"); v1: `cpu.cfs_quota_us` (-1: none) over
    `cpu.cfs_period_us` in the cpu controller's hierarchy. The process's own cgroup is looked up under
    `root` first (the path /proc/self/cgroup names), then the mount's top (a container with its own cgroup
    namespace sees its cgroup there)."""
    try:
        return _cgroup_cpu_limit(proc_cgroup, root)
    except (ValueError, ZeroDivisionError):  # not the kernel's format: no limit known, as without cgroups
        return None


def _cgroup_cpu_limit(proc_cgroup: str, root: str) -> float | None:
    text = _read(proc_cgroup)
    if text is None:
        return None
    for line in text.splitlines():
        _id, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        path = path.strip().lstrip("/")
        if controllers == "":  # v2
            for folder in (os.path.join(root, path), root):
                value = _read(os.path.join(folder, "cpu.max"))
                if value is not None:
                    quota, _, period = value.partition(" ")
                    if quota == "max":
                        return None
                    return int(quota) / int(period or 100000)
        elif "cpu" in controllers.split(","):  # v1
            for mount in (controllers, "cpu", "cpu,cpuacct"):
                for folder in (os.path.join(root, mount, path), os.path.join(root, mount)):
                    quota_text = _read(os.path.join(folder, "cpu.cfs_quota_us"))
                    period_text = _read(os.path.join(folder, "cpu.cfs_period_us"))
                    if quota_text is not None and period_text is not None:
                        quota_us = int(quota_text)
                        return None if quota_us < 0 else quota_us / int(period_text)
    return None


def usable_cpus(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int:
    """The cores chatgate may use: the machine's, fewer by CPU affinity or by a cgroup CPU limit (rounded up:
    a limit of 1.5 cores is 2)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 2
    limit = cgroup_cpu_limit(proc_cgroup, root)
    if limit is not None:
        cores = min(cores, max(1, math.ceil(limit)))
    return cores


def checker_count(cores: int) -> int:
    # One core left to the event loop: checkers on every core starve it (/healthz waits)
    return max(1, min(4, cores - 1))


CHECKERS = checker_count(usable_cpus())
T = TypeVar("T")
log = logging.getLogger("chatgate")


@dataclass(slots=True)
class Checked:
    """A body's check: the family's verdict, and R1's parse of the body (its objects' keys in the body's
    order, where the cache advisor finds its items; None: not JSON, or checked in a checker process)."""

    verdict: Verdict
    parse: Any = None


def check_now(family: Rules, body: bytes, beta: bool, origin: str | None) -> Checked:
    """R1 as DeepSeek reads JSON (duplicate keys, NaN, 1e400, depth), then the family's rules on its parse."""
    parse, strict = parse_strictly(body)
    if strict is not None:
        return Checked(Verdict([strict]))
    return Checked(family.check(body, beta=beta, origin=origin, parse=parse), parse)


class Checkers:
    """The checker processes of one app (its settings make the families they check with)."""

    def __init__(self, settings: Settings, families: Callable[[Settings], list[Family]]) -> None:
        self.settings = settings
        # what a checker process checks with (chatgate/gateway/endpoints.py `families`)
        self.families = families
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    async def check(self, family: Rules, body: bytes, beta: bool, origin: str | None) -> Checked:
        if len(body) <= OFF_LOOP_BYTES:
            if len(body) > WARM_BYTES and self._pool is None:
                self.warm()
            return check_now(family, body, beta, origin)
        verdict = await self._run(functools.partial(_check_in_worker, family.name, body, beta, origin),
                                  functools.partial(_check_large, family, body, beta, origin))
        return Checked(verdict)  # a large body's parse is not kept: it stays where it was made

    async def recheck(self, family: Rules, body: bytes, beta: bool, origin: str | None) -> Verdict:
        """The family's rules alone (a body chatgate repaired), where `check` would run them."""
        if len(body) <= OFF_LOOP_BYTES:
            return family.check(body, beta=beta, origin=origin)
        return await self._run(functools.partial(_check_in_worker, family.name, body, beta, origin, False),
                               functools.partial(family.check, body, beta=beta, origin=origin))

    async def run(self, size: int, work: Callable[[], T]) -> T:
        """`work` (a module-level function and its arguments, on a body of `size` bytes) here for an
        ordinary body, in a checker process for a large one."""
        if size <= OFF_LOOP_BYTES:
            return work()
        return await self._run(functools.partial(_trimmed, work), work)

    async def _run(self, remote: Callable[[], T], local: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor(), remote)
        except BrokenProcessPool:
            log.warning("a checker process died; checking on a thread")
            with self._lock:
                self._pool = None
            return await asyncio.to_thread(local)

    def warm(self) -> None:
        """Start the checker processes now (a no-op task spawns them; its result is not waited for)."""
        try:
            self._executor().submit(_ready)
        except (BrokenProcessPool, RuntimeError):  # died, or shut down: the next large body starts another
            with self._lock:
                self._pool = None

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(CHECKERS, multiprocessing.get_context("spawn"),
                                                 initializer=_start_worker,
                                                 initargs=(self.settings, self.families))
            return self._pool

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


# --- in a checker process -----------------------------------------------------------------------

_families: dict[str, Family] = {}


def _start_worker(settings: Settings, families: Callable[[Settings], list[Family]]) -> None:
    _families.update((f.name, f) for f in families(settings))


def _ready() -> bool:
    return True


def _check_large(family: Rules, body: bytes, beta: bool, origin: str | None) -> Verdict:
    return check_now(family, body, beta, origin).verdict


def _check_in_worker(name: str, body: bytes, beta: bool, origin: str | None, strict: bool = True
                     ) -> Verdict:
    family = _families[name]
    verdict = check_now(family, body, beta, origin).verdict if strict else \
        family.check(body, beta=beta, origin=origin)
    verdict.request = None  # a copy of it back would cost the loop what the process saved it
    _give_back()
    return verdict


def _trimmed(work: Callable[[], T]) -> T:
    result = work()
    _give_back()
    return result


def _give_back() -> None:
    """Return the freed heap of a large body's parse to the system: glibc's malloc keeps it (a checker
    stayed at 380 MB after a 28 MB body of 470,000 messages; after malloc_trim, near where it started)."""
    if _malloc_trim is not None:
        _malloc_trim(0)


def _libc_malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None
    return trim


_malloc_trim = _libc_malloc_trim()
