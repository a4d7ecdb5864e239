"""What is benchmarked: the fake upstream ("direct") and the proxies in front of it, each its own process.

A `Cluster` starts one upstream with a given behaviour and the requested proxies pointing at it, waits
until each answers a real chat request, and always stops every process group on exit.
"""

from __future__ import annotations

import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from bench.common import (
    AUTH_HEADER,
    VENV_BIN,
    Memory,
    Proc,
    free_port,
    package_of,
    read_status_kb,
    wait_ready,
)


@dataclass(frozen=True)
class TargetSpec:
    name: str
    kind: str  # "direct" | "reference" | "aiohttp" | "chatgate"
    transport: str = "aiohttp"  # reference only
    workers: int = 1
    metering: bool = True  # chatgate only
    # chatgate only, for scenarios 11-13:
    env: tuple[tuple[str, str], ...] = ()  # extra env, e.g. (("CHATGATE_REPAIR_RESTORE_REASONING", "false"),)
    store_url: str | None = None  # instead of a fresh sqlite:///<workdir>/<name>.db (kept as it is)
    # run `python -m chatgate serve` with this tree as cwd (`-m app` in a tree from before the rename), not
    # the installed binary
    source_dir: str | None = None
    auth: str = "passthrough"  # chatgate only: `--auth managed` needs a key in its store (`authorization`)
    authorization: str = AUTH_HEADER  # what its ready probe sends

    @property
    def is_chatgate(self) -> bool:
        return self.kind == "chatgate"


DIRECT = TargetSpec("direct", "direct")
REFERENCE = TargetSpec("reference", "reference", transport="aiohttp")
REFERENCE_HTTPX = TargetSpec("reference-httpx", "reference", transport="httpx")
AIOHTTP_FLOOR = TargetSpec("aiohttp-floor", "aiohttp")
CHATGATE = TargetSpec("chatgate", "chatgate")
CHATGATE_METERED = TargetSpec("chatgate-metered", "chatgate")  # scenario 8's twin of chatgate-nometer
CHATGATE_NOMETER = TargetSpec("chatgate-nometer", "chatgate", metering=False)
CHATGATE_W2 = TargetSpec("chatgate-w2", "chatgate", workers=2)
CHATGATE_MEM = TargetSpec("chatgate-mem", "chatgate")
REFERENCE_W2 = TargetSpec("reference-w2", "reference", transport="aiohttp", workers=2)
REFERENCE_MEM = TargetSpec("reference-mem", "reference", transport="aiohttp")

CHATGATE_BIN = VENV_BIN / "chatgate"

# Issue 49's speed lines, against the reference measured in the same run, judged the harsher way
# (docs/performance.md, "Two harnesses, one answer"): scenarios 14 and 15 of bench.run and bench.harness.
C1_ADDED_P50_MS = 0.15  # chatgate's c=1 p50 over the reference's, plain and round-2 bodies
C1_ADDED_CPU_US = 150.0  # the same line the harsher way: CPU time per request over the reference's at c=1
C16_RATIO = 0.97  # chatgate's req/s over the reference's at c=16


@dataclass(frozen=True)
class UpstreamSpec:
    delay_s: float = 0.0
    chunks: int = 10
    chunk_interval_s: float = 0.0
    tool_loop: bool = False  # scenario 11: tool-call answers to requests ending in a user message


@dataclass
class Target:
    spec: TargetSpec
    port: int
    proc: Proc | None  # the upstream's own process for "direct"
    skipped: str | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def memory(self) -> Memory | None:
        if self.proc is None or not self.proc.alive():
            return None
        return self.proc.memory()

    def server_memory(self) -> Memory | None:
        """The server process's own, without the processes it started (chatgate's checker processes)."""
        if self.proc is None or not self.proc.alive():
            return None
        pid = self.proc.pid
        rss, hwm = read_status_kb(pid, "VmRSS"), read_status_kb(pid, "VmHWM")
        return None if rss is None or hwm is None else Memory(rss, hwm)


def chatgate_available() -> str | None:
    """None when `chatgate serve --help` works, else why not."""
    import subprocess

    if not CHATGATE_BIN.exists():
        return f"{CHATGATE_BIN} does not exist"
    try:
        proc = subprocess.run(
            [str(CHATGATE_BIN), "serve", "--help"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`chatgate serve --help` failed: {exc}"
    if proc.returncode != 0:
        return f"`chatgate serve --help` exited {proc.returncode}: {(proc.stderr or proc.stdout)[-300:]}"
    return None


def _argv(spec: TargetSpec, port: int, upstream_url: str, workdir: Path) -> tuple[list[str], dict[str, str]]:
    py = sys.executable
    if spec.kind == "reference":
        argv = [py, "-m", "bench.reference", "--port", str(port), "--upstream", upstream_url]
        return [*argv, "--transport", spec.transport, "--workers", str(spec.workers)], {}
    if spec.kind == "aiohttp":
        argv = [py, "-m", "bench.aiohttp_passthrough", "--port", str(port), "--upstream", upstream_url]
        return [*argv, "--workers", str(spec.workers)], {}
    if spec.kind == "chatgate":
        # `python -m chatgate` puts the cwd (source_dir) first on sys.path: that tree's package is imported,
        # ahead of the editable install's finder (which sits after the path finder in sys.meta_path).
        head = [py, "-m", package_of(Path(spec.source_dir))] if spec.source_dir else [str(CHATGATE_BIN)]
        argv = [*head, "serve", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--upstream", upstream_url, "--auth", spec.auth, "--workers", str(spec.workers)]
        env: dict[str, str] = {}
        if not spec.metering:
            env["CHATGATE_STORE_URL"] = "none"
        elif spec.store_url:
            argv += ["--store", spec.store_url]
        else:
            argv += ["--store", f"sqlite:///{workdir / (spec.name + '.db')}"]
        if spec.metering:  # its spool and turn ring with its store, not in the tree it runs from
            env["CHATGATE_STORE_SPOOL_DIR"] = str(workdir / f"spool-{spec.name}")
        env.update(spec.env)
        return argv, env
    raise ValueError(spec.kind)


@dataclass
class Cluster:
    """Upstream + targets for one scenario group. Use as a context manager."""

    label: str
    upstream: UpstreamSpec
    specs: list[TargetSpec]
    workdir: Path
    ready_body: bytes
    chatgate_problem: str | None = None
    startup_timeout_s: float = 60.0
    targets: dict[str, Target] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    upstream_port: int = 0

    def __enter__(self) -> Cluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _start(self) -> None:
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.upstream_port = free_port()
        up = self.upstream
        upstream_proc = Proc(
            f"upstream-{self.label}",
            [
                sys.executable,
                "-m",
                "bench.upstream",
                "--port",
                str(self.upstream_port),
                "--delay",
                str(up.delay_s),
                "--chunks",
                str(up.chunks),
                "--chunk-interval",
                str(up.chunk_interval_s),
                *(["--tool-loop"] if up.tool_loop else []),
            ],
            logs / f"{self.label}-upstream.log",
        )
        self.procs.append(upstream_proc)
        upstream_proc.start()
        # The ready probe must not wait for the long-stream / slow-answer behaviour: it is non-streaming.
        why = wait_ready(upstream_proc, self.upstream_port, self.ready_body, 10.0 + up.delay_s * 2)
        if why:
            raise RuntimeError(f"upstream did not start: {why}\n{upstream_proc.log_tail()}")
        upstream_url = f"http://127.0.0.1:{self.upstream_port}"
        pending: list[Target] = []
        for spec in self.specs:
            if spec.kind == "direct":
                self.targets[spec.name] = Target(spec, self.upstream_port, upstream_proc)
                continue
            port = free_port()
            if spec.is_chatgate and self.chatgate_problem:
                self.targets[spec.name] = Target(spec, port, None, skipped=self.chatgate_problem)
                continue
            if spec.is_chatgate and not spec.store_url and (self.workdir / (spec.name + ".db")).exists():
                (self.workdir / (spec.name + ".db")).unlink()
            argv, env = _argv(spec, port, upstream_url, self.workdir)
            cwd = Path(spec.source_dir) if spec.source_dir else None
            proc = Proc(spec.name, argv, logs / f"{self.label}-{spec.name}.log", env=env, cwd=cwd)
            self.procs.append(proc)
            proc.start()
            target = Target(spec, port, proc)
            self.targets[spec.name] = target
            pending.append(target)
        timeout = self.startup_timeout_s + 2 * self.upstream.delay_s
        with ThreadPoolExecutor(max_workers=max(1, len(pending))) as pool:
            waits = {
                t.name: pool.submit(
                    wait_ready, t.proc, t.port, self.ready_body, timeout, t.spec.authorization
                )
                for t in pending
            }
        for target in pending:
            assert target.proc is not None
            why = waits[target.name].result()
            if why:
                target.skipped = f"{target.name} did not start: {why}; log: {target.proc.log_tail(5)}"
                target.proc.stop()
                if not target.spec.is_chatgate:
                    raise RuntimeError(target.skipped)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            try:
                proc.stop()
            except Exception as exc:  # keep stopping the others
                print(f"warning: stopping {proc.name}: {exc}", file=sys.stderr)

    def live(self, names: list[str]) -> list[Target]:
        """The named targets that exist and started, in the given order."""
        return [self.targets[n] for n in names if n in self.targets and not self.targets[n].skipped]

    def skipped(self, names: list[str]) -> dict[str, str]:
        return {
            n: self.targets[n].skipped or "" for n in names if n in self.targets and self.targets[n].skipped
        }


class MemorySampler:
    """Samples a target's summed VmRSS in a thread; `peak_kb` is the highest seen."""

    def __init__(self, target: Target, period_s: float = 0.5) -> None:
        import threading

        self.target = target
        self.period_s = period_s
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            mem = self.target.memory()
            if mem is not None:
                self.peak_kb = max(self.peak_kb, mem.rss_kb)
            self._stop.wait(self.period_s)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        mem = self.target.memory()
        if mem is not None:
            self.peak_kb = max(self.peak_kb, mem.rss_kb)


def remove_tree(path: Path) -> None:
    for _ in range(3):
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            return
        time.sleep(0.2)
