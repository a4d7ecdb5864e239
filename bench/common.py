"""Process, port and /proc helpers shared by the runner and the servers."""

from __future__ import annotations

import contextlib
import http.client
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
VENV_BIN = Path(sys.executable).parent
AUTH_HEADER = "Bearer sk-bench"
# The import package of a source tree: `chatgate`, or `app` in a tree from before the rename (issue 50),
# which bench.pair, `bench.harness --base`, scenario 12 and the `--tree` options still run.
PACKAGES = ("chatgate", "app")  # `app`: a tree from before the rename
CHAT_PATH = "/v1/chat/completions"


def package_of(tree: Path) -> str:
    """The import package of a checkout or `git archive` copy: the first of PACKAGES it holds."""
    return next((name for name in PACKAGES if (tree / name / "__init__.py").is_file()), PACKAGES[0])


def raise_nofile_limit(wanted: int = 65536) -> int:
    """Raise RLIMIT_NOFILE (soft, and hard when we may) so thousands of sockets fit; returns the soft one."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    target_hard = max(hard, wanted)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target_hard, target_hard))
    except (ValueError, OSError):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_status_kb(pid: int, field_name: str) -> int | None:
    """A `VmRSS`/`VmHWM`-style field of /proc/PID/status in kB, None when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    return None


def group_pids(pgid: int) -> list[int]:
    """All live pids whose process group is `pgid` (a server and the workers it forked)."""
    pids: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # pgrp is the 3rd field after the ")" that closes the command name.
        rest = stat[stat.rfind(")") + 2 :].split()
        if len(rest) > 2 and int(rest[2]) == pgid:
            pids.append(int(entry))
    return pids


@dataclass
class Memory:
    rss_kb: int
    hwm_kb: int


def group_memory(pgid: int) -> Memory:
    """Summed VmRSS and VmHWM of a process group (one process for a single-worker server)."""
    rss = hwm = 0
    for pid in group_pids(pgid):
        rss += read_status_kb(pid, "VmRSS") or 0
        hwm += read_status_kb(pid, "VmHWM") or 0
    return Memory(rss, hwm)


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU time of a process group's live processes (Linux /proc)."""
    ticks = 0
    for pid in group_pids(pgid):
        try:
            rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(rest[11]) + int(rest[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM this child when the runner dies, even by SIGKILL (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@dataclass
class Proc:
    """A child started in its own session (process group), killed as a group."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None
    cwd: Path | None = None  # default: the repository

    def start(self) -> None:
        env = dict(os.environ)
        env.update(self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        log = self.log_path.open("wb")
        try:
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(self.cwd or REPO_DIR),
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        finally:
            log.close()

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def memory(self) -> Memory:
        return group_memory(self.pid)

    def log_tail(self, n: int = 15) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def stop(self, grace_s: float = 3.0) -> None:
        if self.popen is None:
            return
        pgid = self.popen.pid
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and group_pids(pgid):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.popen.wait(timeout=0.05)
            if not group_pids(pgid):
                break
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=1.0)


def post_once(
    port: int, body: bytes, path: str = CHAT_PATH, timeout: float = 5.0, authorization: str = AUTH_HEADER
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(
            "POST",
            path,
            body=body,
            headers={"Content-Type": "application/json", "Authorization": authorization},
        )
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def request_once(
    port: int,
    method: str = "POST",
    path: str = CHAT_PATH,
    body: bytes | None = None,
    authorization: str | None = AUTH_HEADER,
    timeout: float = 10.0,
) -> tuple[int, dict[str, str], bytes]:
    """One request on a new connection: (status, headers with lower-case names, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if authorization:
        headers["Authorization"] = authorization
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def warm_up(port: int, bodies: list[bytes], count: int, authorization: str = AUTH_HEADER) -> None:
    """`count` sequential requests over one keep-alive connection, cycling through `bodies`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10.0)
    headers = {"Content-Type": "application/json", "Authorization": authorization}
    try:
        for i in range(count):
            conn.request("POST", CHAT_PATH, body=bodies[i % len(bodies)], headers=headers)
            conn.getresponse().read()
    finally:
        conn.close()


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def wait_ready(
    proc: Proc | None, port: int, body: bytes, timeout_s: float, authorization: str = AUTH_HEADER
) -> str | None:
    """Poll with a real chat request until it answers 200. Returns None when ready, else why not."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            return f"exited with code {proc.popen.returncode if proc.popen else '?'}"
        try:
            status, payload = post_once(port, body, timeout=5.0, authorization=authorization)
            if status == 200:
                return None
            last = f"HTTP {status}: {payload[:200]!r}"
        except OSError as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.1)
    return f"not ready after {timeout_s:.0f} s ({last})"
