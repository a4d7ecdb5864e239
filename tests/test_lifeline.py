"""An interrupted test run leaves no process behind (tests/lifeline.py).

A pytest of its own starts what the suite starts: chatgate as its own process with two workers (its own
process group, as `spawn_chatgate` does), the fake DeepSeek as a process, a redis-server and a node process
(when node is installed); then it waits. This test kills that pytest (SIGTERM as a CI timeout does, SIGINT as
Ctrl-C does, and SIGKILL the controller of a `pytest -n 1` run, whose worker runs the servers) and checks
that no process carrying the run's marker in its environment is left a few seconds later: every descendant
inherits it, the uvicorn workers and the lifeline guard included.
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
import time
from pathlib import Path

import pytest

from tests import lifeline
from tests.harness import REPO_ROOT

MARK = "LIFELINE_TEST_RUN"  # not CHATGATE_*: spawn_chatgate drops those

INNER = """
import os, shutil, time
from pathlib import Path

from tests import lifeline
from tests.fakes.server import spawn_fake_deepseek
from tests.harness import spawn_chatgate
from tests.quotas.support import RedisServer


def test_servers_then_wait(tmp_path: Path) -> None:
    with spawn_fake_deepseek() as fake, \\
            spawn_chatgate(tmp_path, "--upstream", fake.url, "--workers", "2", "--auth", "passthrough"):
        redis = RedisServer(tmp_path)
        redis.start()
        pids = [redis.process.pid]
        node = shutil.which("node")
        if node:
            pids.append(lifeline.Popen([node, "-e", "setInterval(() => {}, 1000)"]).pid)
        Path(os.environ["LIFELINE_READY"]).write_text(" ".join(map(str, pids)))
        time.sleep(600)
"""


def marked(token: str, pids: list[int]) -> dict[int, str]:
    """Live processes whose environment holds the marker, and those of `pids` (redis-server writes its
    process title over its environment): pid -> command line."""
    needle = f"{MARK}={token}".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int(entry.name) not in pids and needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            if (entry / "stat").read_text().rpartition(")")[2].split()[0] == "Z":
                continue  # a zombie holds nothing but its exit status
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            found[int(entry.name)] = command.decode(errors="replace")
        except OSError:
            continue
    return found


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(("sig", "xdist"), [
    (signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGKILL, True),
], ids=["SIGTERM", "SIGINT", "SIGKILL-xdist"])
def test_killed_run_leaves_nothing(tmp_path: Path, sig: signal.Signals, xdist: bool) -> None:
    token = secrets.token_hex(8)
    (tmp_path / "test_inner.py").write_text(INNER)
    ready = tmp_path / "ready"
    env = {**os.environ, MARK: token, "LIFELINE_READY": str(ready),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:langsmith_plugin",
            "--basetemp", str(tmp_path / "inner"), *(["-n", "1"] if xdist else []), "test_inner.py"]
    with (tmp_path / "inner.log").open("wb") as log:
        inner = lifeline.Popen(argv, cwd=tmp_path, env=env, stdout=log, stderr=log)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 90
        while not ready.exists():
            assert inner.poll() is None, (tmp_path / "inner.log").read_text()
            assert time.monotonic() < deadline, "the inner run did not start its servers"
            time.sleep(0.05)
        pids = [int(pid) for pid in ready.read_text().split()]
        running = marked(token, pids)
        commands = list(running.values())
        assert sum("chatgate serve" in c for c in commands) == 1, commands
        assert sum("multiprocessing" in c for c in commands) >= 2, commands  # chatgate's two workers
        assert any("tests.fakes.server" in c for c in commands), commands
        assert any("redis-server" in c for c in commands), commands
        assert len(running) >= 6 + (len(pids) - 1), commands  # pytest, guard, fake, chatgate and workers
        assert any("tests/lifeline.py" in c for c in commands), commands  # the guard
        os.kill(inner.pid, sig)
        inner.wait(60)
        deadline = time.monotonic() + 30
        while (left := marked(token, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"left behind after {sig.name}: {left}"
    finally:
        for pid in marked(token, pids):
            os.kill(pid, signal.SIGKILL)


def test_tests_start_their_processes_through_the_lifeline() -> None:
    """A process a test leaves running (a server, a client it waits for) is a lifeline.Popen: a plain
    subprocess.Popen would outlive a killed run. Short `subprocess.run` calls pass die_with_parent()."""
    plain = [f"{path.relative_to(REPO_ROOT)}:{n}"
             for path in sorted((REPO_ROOT / "tests").rglob("*.py")) if "node_modules" not in path.parts
             for n, line in enumerate(path.read_text().splitlines(), 1) if "subprocess.Popen(" in line
             and path.name not in ("lifeline.py", "test_lifeline.py")]
    assert not plain, f"use tests.lifeline.Popen instead: {plain}"
