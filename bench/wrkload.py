"""Closed-loop load with wrk (its own process): req/s and latency percentiles as a dict."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.common import AUTH_HEADER, BENCH_DIR, CHAT_PATH

LUA = BENCH_DIR / "wrk_post.lua"


@dataclass
class WrkResult:
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    requests: int
    errors: int
    duration_s: float

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


def wrk_available() -> bool:
    return shutil.which("wrk") is not None


def run_wrk(
    port: int,
    body: Path,
    connections: int,
    duration_s: int,
    threads: int = 1,
    timeout_s: int = 10,
    path: str = CHAT_PATH,
    authorization: str = AUTH_HEADER,
) -> WrkResult:
    """Run wrk against 127.0.0.1:port; raises RuntimeError when wrk fails or prints no summary."""
    threads = max(1, min(threads, connections))
    argv = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{max(1, duration_s)}s",
        f"--timeout={timeout_s}s",
        "-s",
        str(LUA),
        f"http://127.0.0.1:{port}{path}",
    ]
    env = dict(os.environ, BENCH_BODY=str(body), BENCH_PATH=path, BENCH_AUTH=authorization)
    proc = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=duration_s + timeout_s + 30, check=False
    )
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            raw = json.loads(line[len("BENCH_JSON ") :])
            break
    else:
        raise RuntimeError(f"wrk failed (rc={proc.returncode}): {proc.stdout[-500:]} {proc.stderr[-500:]}")
    duration = raw["duration_us"] / 1e6
    errors = sum(
        raw[k] for k in ("connect_errors", "read_errors", "write_errors", "status_errors", "timeouts")
    )
    return WrkResult(
        rps=raw["requests"] / duration if duration else 0.0,
        p50_ms=raw["p50_us"] / 1000.0,
        p90_ms=raw["p90_us"] / 1000.0,
        p99_ms=raw["p99_us"] / 1000.0,
        mean_ms=raw["mean_us"] / 1000.0,
        max_ms=raw["max_us"] / 1000.0,
        requests=int(raw["requests"]),
        errors=int(errors),
        duration_s=duration,
    )
