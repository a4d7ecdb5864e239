"""Instructions per request under callgrind: a deterministic cost of a feature, beside the req/s ratios.

The twins' req/s ratios (scenarios 11 and 13) move by ±10% from round to round on a noisy 2-core host;
instruction counts do not. Each twin runs under `valgrind --tool=callgrind` with instrumentation off;
after a warm-up it is switched on (`callgrind_control -i on`) for a fixed number of sequential requests over
one keep-alive connection, then dumped. The fake upstream runs natively. Prints instructions per request of
each twin and their ratio (what the extra work costs, not what it costs in req/s at c=16, which also
depends on the client and upstream sharing the cores).

    python -m bench.instructions limits        # scenario 13's twins: limits on / off
    python -m bench.instructions restore       # scenario 11's twins: restore on (round 2 without reasoning)
                                               # / off (round 2 sends it back); one loop = two requests
    python -m bench.instructions tracing [--stream]
                                               # the plain request with tracing on (every request sampled,
                                               # a live OTLP/HTTP receiver: bench/otlp_sink.py) / off;
                                               # warm-up and count in whole export batches of 256
    python -m bench.instructions advisor [--loop]
                                               # the cache advisor's fingerprints on / off
                                               # (CHATGATE_CACHE_BREAKS): the plain request, or with
                                               # --loop scenario 11's tool loop (bench.pair's load)
    python -m bench.instructions runs [--stream]
                                               # scenario 11's tool loop with agent runs on / off
                                               # (CHATGATE_RUNS_ENABLED): a new run every loop
    python -m bench.instructions all [--stream]
                                               # scenario 14's everything-on chatgate (managed mode, a key
                                               # with limits on every kind, DEEPSEEK_API_KEY set) / the
                                               # default chatgate (passthrough), the plain request
    python -m bench.instructions plain [--tree DIR ...] [--stream]
                                               # the plain request (6 KB agent body, default settings) of
                                               # each tree: a checkout or a `git archive` of a commit
                                               # (`ref` is bench/reference.py); default: this checkout
Needs valgrind (`apt-get install valgrind`).
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bench.bodies import agent_body
from bench.common import CHAT_PATH, PACKAGES, VENV_BIN, free_port, package_of
from bench.scenarios_limits import set_key_limits
from bench.scenarios_product import create_key
from bench.toolloop import parse_answer, round1, round2

SECRET = "sk-bench"
Send = Callable[[http.client.HTTPConnection, int], int]  # (connection, i) -> requests made


def _post(conn: http.client.HTTPConnection, body: bytes, key: str = SECRET) -> bytes:
    conn.request("POST", CHAT_PATH, body=body, headers={"Content-Type": "application/json",
                                                       "Authorization": f"Bearer {key}"})
    resp = conn.getresponse()
    raw = resp.read()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {raw[:300]!r}")
    return raw


def plain(stream: bool, key: str = SECRET) -> Send:
    body = orjson.dumps(agent_body(stream=stream))

    def send(conn: http.client.HTTPConnection, i: int) -> int:
        _post(conn, body, key)
        return 1

    return send


def loop(stream: bool, send_reasoning: bool) -> Send:
    first = round1(stream)
    body1 = orjson.dumps(first)

    def send(conn: http.client.HTTPConnection, i: int) -> int:
        key = f"sk-loop-{i % 16}"
        call, reasoning, _ = parse_answer(_post(conn, body1, key), stream)
        if call is None:
            raise RuntimeError("round 1 answered without a tool call")
        _post(conn, orjson.dumps(round2(first, call, reasoning if send_reasoning else None)), key)
        return 2

    return send


def _wait(port: int, proc: subprocess.Popen[bytes], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            conn.close()
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"not listening on {port} after {seconds:.0f} s")


def _total(outfile: Path) -> int:
    text = outfile.read_text(errors="replace")
    found = [int(n) for n in re.findall(r"^(?:summary|totals): (\d+)", text, re.M)]
    if not found:
        raise RuntimeError(f"no totals in {outfile}")
    return max(found)


def measure(name: str, env: dict[str, str], store: str, upstream: str, send: Send, warm: int, count: int,
            workdir: Path, tree: str | None = None, settle: float = 0.5, auth: str = "passthrough") -> float:
    """Instructions per request of chatgate (from `tree` when given; "ref": bench/reference.py). `settle`:
    seconds left before the count (the warm-up's background work done) and after it (the counted requests'
    background work, such as the trace exporter's batch every 5 s, done and counted). `auth`: chatgate's
    --auth mode."""
    port = free_port()
    out = workdir / f"{name}.callgrind"
    argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
            str(VENV_BIN / "python"), "-m"]
    if tree == "ref":
        argv += ["bench.reference", "--port", str(port), "--upstream", upstream]
    else:
        package = package_of(Path(tree).resolve()) if tree is not None else PACKAGES[0]
        argv += [package, "serve", "--host", "127.0.0.1", "--port", str(port), "--upstream", upstream,
                 "--auth", auth, "--workers", "1", "--store", store]
    if tree not in (None, "ref"):
        env = {**env, "PYTHONPATH": str(Path(tree).resolve())}
    log = (workdir / f"{name}.log").open("wb")
    cwd = Path(tree).resolve() if tree not in (None, "ref") else None
    proc = subprocess.Popen(argv, env={**os.environ, **env}, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait(port, proc, 600)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        made = 0
        for i in range(warm):
            send(conn, i)
        time.sleep(settle - 0.5)
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True)
        for i in range(warm, warm + count):
            made += send(conn, i)
        time.sleep(settle)  # what the last answer left to do (a flush, a settlement) is counted as well
        subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
        conn.close()
        dumps = sorted(workdir.glob(f"{name}.callgrind.*"), key=lambda p: p.stat().st_mtime)
        total = _total(dumps[-1]) if dumps else _total(out)
        return total / made
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("twins", choices=["limits", "restore", "plain", "tracing", "advisor", "runs", "all"])
    parser.add_argument("--tree", action="append", help="plain: a tree to measure (repeat to compare)")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--loop", action="store_true", help="advisor: the tool loop, not the plain request")
    parser.add_argument("--count", type=int, default=200, help="requests (loops) counted per twin")
    parser.add_argument("--warm", type=int, default=100)
    parser.add_argument("--only", choices=["on", "off"], help="measure one twin only")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed")
    workdir = Path(tempfile.mkdtemp(prefix="chatgate-instr-"))
    up_port = free_port()
    up_argv = [sys.executable, "-m", "bench.upstream", "--port", str(up_port)]
    up_argv += ["--tool-loop"] if args.twins in ("restore", "runs") or args.loop else []
    upstream = subprocess.Popen(up_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sink: subprocess.Popen[bytes] | None = None
    settle = 0.5
    results: dict[str, float] = {}
    try:
        time.sleep(1.0)
        url = f"http://127.0.0.1:{up_port}"
        twins: list[tuple[str, dict[str, str], str, Send]]
        if args.twins == "plain":
            for k, tree in enumerate(args.tree or [None]):
                name = f"{k}-{Path(tree).name if tree else 'this'}"
                results[name] = measure(name, {}, f"sqlite:///{workdir / (name + '.db')}", url,
                                        plain(args.stream), args.warm, args.count, workdir, tree)
                print(f"{name} ({tree or 'this checkout'}): {results[name]:,.0f} instructions per request",
                      flush=True)
            twins = []
        elif args.twins == "tracing":
            sink_port = free_port()
            sink = subprocess.Popen([sys.executable, "-m", "bench.otlp_sink", "--port", str(sink_port)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # the batch processor exports a full batch (256 requests, 512 spans) at once, and the rest every
            # 5 s: under callgrind's slowness that timer would send a POST every few dozen requests, where
            # under load nearly every POST is a full batch. So the timer is off, and the warm-up and the
            # count are whole batches, each POSTed as it fills (settle: its export done before the count
            # starts, and counted at its end)
            on_env = {"CHATGATE_TRACING_ENABLED": "true",
                      "CHATGATE_TRACING_ENDPOINT": f"http://127.0.0.1:{sink_port}",
                      "OTEL_BSP_SCHEDULE_DELAY": "600000"}
            args.warm, args.count = (-(-max(n, 1) // 256) * 256 for n in (args.warm, args.count))
            settle = 6.0
            twins = [("tracing-on", on_env, f"sqlite:///{workdir / 'on.db'}", plain(args.stream)),
                     ("tracing-off", {}, f"sqlite:///{workdir / 'off.db'}", plain(args.stream))]
        elif args.twins == "limits":
            on_db, off_db = f"sqlite:///{workdir / 'on.db'}", f"sqlite:///{workdir / 'off.db'}"
            set_key_limits(on_db, SECRET)
            twins = [("limits-on", {}, on_db, plain(args.stream)),
                     ("limits-off", {}, off_db, plain(args.stream))]
        elif args.twins == "all":
            on_db, off_db = f"sqlite:///{workdir / 'on.db'}", f"sqlite:///{workdir / 'off.db'}"
            on_env = {"DEEPSEEK_API_KEY": "sk-bench-upstream"}
            twins = [("all-on", on_env, on_db, plain(args.stream, create_key(on_db))),
                     ("all-off", {}, off_db, plain(args.stream))]
        elif args.twins == "advisor":
            load = loop(args.stream, False) if args.loop else plain(args.stream)
            on, off = f"sqlite:///{workdir / 'on.db'}", f"sqlite:///{workdir / 'off.db'}"
            twins = [("advisor-on", {"CHATGATE_CACHE_BREAKS": "true"}, on, load),
                     ("advisor-off", {"CHATGATE_CACHE_BREAKS": "false"}, off, load)]
        elif args.twins == "runs":
            load = loop(args.stream, False)
            on, off = f"sqlite:///{workdir / 'on.db'}", f"sqlite:///{workdir / 'off.db'}"
            twins = [("runs-on", {}, on, load), ("runs-off", {"CHATGATE_RUNS_ENABLED": "false"}, off, load)]
        else:
            off_env = {"CHATGATE_REPAIR_RESTORE_REASONING": "false"}
            twins = [("restore-on", {}, f"sqlite:///{workdir / 'on.db'}", loop(args.stream, False)),
                     ("restore-off", off_env, f"sqlite:///{workdir / 'off.db'}", loop(args.stream, True))]
        for name, env, store, send in twins:
            if args.only and not name.endswith("-" + args.only):
                continue
            results[name] = measure(name, env, store, url, send, args.warm, args.count, workdir,
                                    settle=settle, auth="managed" if name == "all-on" else "passthrough")
            print(f"{name}: {results[name]:,.0f} instructions per request", flush=True)
    finally:
        for proc in (upstream, sink):
            if proc is not None:
                proc.terminate()
                proc.wait(10)
    if len(results) == 2:
        (a, x), (b, y) = results.items()
        print(f"{a} / {b}: {x / y:.3f} ({x - y:+,.0f} instructions per request); files in {workdir}")
    results_json: dict[str, Any] = {"twins": args.twins, "stream": args.stream, **results}
    print("INSTR_JSON " + orjson.dumps(results_json).decode())


if __name__ == "__main__":
    main()
