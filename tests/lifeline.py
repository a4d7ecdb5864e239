"""Processes a test starts die with the test run, however it ends (Ctrl-C, a CI timeout, `kill -9` of pytest).

Two mechanisms, because either alone leaves something behind:
- `die_with_parent()`, a preexec_fn: on Linux the child gets SIGKILL the moment the process that started it
  dies (PR_SET_PDEATHSIG), and a child whose parent is already gone when it starts exits at once.
- `watch(process)`: a guard process (one per test process, started on first use, in a session of its own so
  a Ctrl-C or a kill of pytest's process group does not reach it) that waits until the test process is gone,
  then kills every process and process group still registered with it. It covers what a death signal
  cannot: the workers a spawned `chatgate --workers N` forks (grandchildren of pytest, in the server's own
  group), and systems without prctl.

`Popen` does both: use it for a server a test starts, and `preexec_fn=die_with_parent()` for a short
`subprocess.run`. tests/test_lifeline.py kills a pytest that runs servers and checks nothing is left.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO, Any

PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


_PRCTL = _load_prctl()


def die_with_parent() -> Callable[[], None]:
    """A preexec_fn for subprocess: the child dies with the process (thread, on Linux) that starts it.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child ends: start children from the test's own
    thread (or one that outlives them), as the fixtures do."""
    parent = os.getpid()
    prctl = _PRCTL

    def preexec() -> None:
        # an ignored SIGINT or SIGTERM is inherited across exec (and Python then installs no KeyboardInterrupt
        # handler): a child must stop when its test stops it, whatever the test process ignores
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() != parent:  # the parent died between fork and prctl: nobody would kill us
            os._exit(1)

    return preexec


def die_with_parent_now(parent: int) -> None:
    """The same for this process, started by someone else (a pytest-xdist worker: the controller)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:
        os._exit(1)


class Popen(subprocess.Popen[Any]):
    """subprocess.Popen whose process (and, with start_new_session, its whole group) dies with the test
    process: a death signal, and the guard for whatever the signal misses."""

    def __init__(self, args: Any, **kwargs: Any) -> None:
        assert "preexec_fn" not in kwargs, "lifeline.Popen sets preexec_fn itself"
        super().__init__(args, preexec_fn=die_with_parent(), **kwargs)
        self._group = bool(kwargs.get("start_new_session"))
        watch(self.pid, group=self._group)

    def _handle_exitstatus(self, *args: Any, **kwargs: Any) -> None:
        super()._handle_exitstatus(*args, **kwargs)
        # reaped: the pid may be reused from now on, so the guard must forget it (a group is forgotten when
        # the fixture that started it says so: its workers may outlive the leader)
        if not self._group:
            with contextlib.suppress(OSError, ValueError):  # at interpreter exit the guard's pipe may be shut
                unwatch(self.pid, group=False)


# ---------------------------------------------------------------------------------------------- the guard

_lock = threading.Lock()
_guard: dict[int, IO[str]] = {}  # test process pid -> the pipe to its guard (a forked child starts its own)


def _send(line: str) -> None:
    with _lock:
        pipe = _guard.get(os.getpid())
        if pipe is None:
            guard = subprocess.Popen([sys.executable, "-S", __file__, str(os.getpid())],
                                     stdin=subprocess.PIPE, text=True, start_new_session=True)
            assert guard.stdin is not None
            pipe = _guard[os.getpid()] = guard.stdin
        pipe.write(line + "\n")
        pipe.flush()


def watch(pid: int, group: bool = False) -> None:
    """Have the guard kill `pid` (with `group`, its process group) if this process dies first."""
    _send(f"+{'g' if group else 'p'} {pid}")


def unwatch(pid: int, group: bool = False) -> None:
    """The test ended `pid` (or its group) itself: the guard forgets it, before the pid can be reused."""
    _send(f"-{'g' if group else 'p'} {pid}")


def _guard_main(parent: int) -> None:
    """Read registrations from stdin until this guard's parent is gone (EOF, or a new parent pid), then kill
    whatever is still registered."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    watched: set[tuple[str, int]] = set()
    buffer = b""
    fd = sys.stdin.fileno()
    while True:
        orphaned = os.getppid() != parent
        ready, _, _ = select.select([fd], [], [], 0 if orphaned else 0.5)
        data = os.read(fd, 65536) if ready else b""
        if (ready and not data) or (orphaned and not ready):
            break
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            op, kind, pid = line[:1], line[1:2].decode(), int(line[3:])
            (watched.add if op == b"+" else watched.discard)((kind, pid))
    for kind, pid in watched:
        with contextlib.suppress(OSError):
            (os.killpg if kind == "g" else os.kill)(pid, signal.SIGKILL)


if __name__ == "__main__":
    _guard_main(int(sys.argv[1]))
