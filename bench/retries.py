"""DeepSeek's bad minutes, short form: a share of first attempts answered 503, chatgate retrying them.

Starts the test suite's fake DeepSeek (its own process) with `fault_ratio` of the requests answered 503 on
their first attempt only, and `chatgate serve` (its own process, default retry settings: 2 retries, 200 ms
base, so the waits of one request add up to at most 0.2 + 0.4 = 0.6 s, the back-off budget) in front of it;
then `--concurrency` clients send non-streaming and streaming requests for `--seconds`, their own retries
off. Prints the client errors, the requests retried (the fake's records) and the latency percentiles, and
checks the issue's targets: 0 client errors, p99 < 2 x the back-off budget. Exit 1 when a target fails.

With `--c1`, no faults: two chatgates in front of the same fake, retries off
(`CHATGATE_UPSTREAM_RETRIES=0`) and on (the default), and one client sending one request at a time to the
fake directly, to the one and to the other in turn (non-streaming and streaming alternating); prints each
one's p50 and p99 and its added p50 over direct: what having retries on costs a request at c=1.

    python -m bench.retries                       # 30% of first attempts 503, c=16, 20 s
    python -m bench.retries --ratio 0 --seconds 10  # the same load without faults, for comparison
    python -m bench.retries --c1 --seconds 30 --chunk-delay 0  # c=1, retries off / on / direct in turn
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2

from bench.common import REPO_DIR, free_port
from tests.fakes.server import spawn_fake_deepseek

BODY = {"model": "deepseek-flash", "messages": [{"role": "user", "content": "Write a haiku about retries."}],
        "thinking": {"type": "disabled"}}


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def client(url: str, until: float, latencies: list[float], errors: list[str], n: int) -> None:
    async with httpx2.AsyncClient(base_url=url, timeout=60) as http:
        i = 0
        while time.perf_counter() < until:
            stream = (n + i) % 2 == 0
            i += 1
            headers = {"authorization": "Bearer sk-bench-retries", "x-request-id": uuid.uuid4().hex}
            t0 = time.perf_counter()
            try:
                async with http.stream("POST", "/v1/chat/completions", json={**BODY, "stream": stream},
                                       headers=headers) as resp:
                    data = await resp.aread()
                ok = resp.status_code == 200 and (not stream or data.rstrip().endswith(b"data: [DONE]"))
                if not ok:
                    errors.append(f"{resp.status_code} {data[:120]!r}")
                    continue
            except httpx2.HTTPError as exc:
                errors.append(type(exc).__name__)
                continue
            latencies.append(time.perf_counter() - t0)


async def load(url: str, concurrency: int, seconds: float) -> tuple[list[float], list[str]]:
    latencies: list[float] = []
    errors: list[str] = []
    until = time.perf_counter() + seconds
    await asyncio.gather(*(client(url, until, latencies, errors, n) for n in range(concurrency)))
    return latencies, errors


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"chatgate exited: {log.read_text()[-2000:]}")
        with contextlib.suppress(httpx2.HTTPError):
            if httpx2.get(url + "/healthz", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise SystemExit("chatgate did not become healthy")


@contextlib.contextmanager
def serving(fake_url: str, workdir: Path, name: str, env_extra: dict[str, str] | None = None
            ) -> Iterator[str]:
    """`chatgate serve` in front of `fake_url` (its own process, SQLite in `workdir`); yields its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATGATE_")}
    env |= {"CHATGATE_STORE_SPOOL_DIR": str(workdir / f"spool-{name}"), "CHATGATE_SERVER_ACCESS_LOG": "false",
            "PYTHONPATH": str(REPO_DIR), **(env_extra or {})}
    log = workdir / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "chatgate", "serve", "--port", str(port), "--upstream",
                                 fake_url, "--store", f"sqlite:///{workdir / f'{name}.db'}"],
                                cwd=REPO_DIR, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_healthy(url, proc, log)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


async def one_at_a_time(urls: dict[str, str], seconds: float) -> dict[tuple[str, bool], list[float]]:
    """One request at a time to each URL in turn, the order rotated each round; latencies by (name, stream)
    (the fake's own routes have no /v1)."""
    latencies: dict[tuple[str, bool], list[float]] = {(n, st): [] for n in urls for st in (False, True)}
    clients = {name: httpx2.AsyncClient(base_url=url, timeout=60) for name, url in urls.items()}
    names = list(clients)
    until = time.perf_counter() + seconds
    i = 0
    try:
        while time.perf_counter() < until:
            stream = i % 2 == 0
            i += 1
            for k in range(len(names)):
                name = names[(i // 2 + k) % len(names)]
                path = "/chat/completions" if name == "direct" else "/v1/chat/completions"
                headers = {"authorization": "Bearer sk-bench-retries", "x-request-id": uuid.uuid4().hex}
                body = {**BODY, "stream": stream}
                t0 = time.perf_counter()
                async with clients[name].stream("POST", path, json=body, headers=headers) as resp:
                    await resp.aread()
                if resp.status_code != 200:
                    raise SystemExit(f"{name}: {resp.status_code}")
                latencies[(name, stream)].append(time.perf_counter() - t0)
    finally:
        for http in clients.values():
            await http.aclose()
    return latencies


def c1(args: argparse.Namespace, workdir: Path) -> int:
    with spawn_fake_deepseek("--chunk-delay", str(args.chunk_delay)) as fake, \
            serving(fake.url, workdir, "retries-off", {"CHATGATE_UPSTREAM_RETRIES": "0"}) as off_url, \
            serving(fake.url, workdir, "retries-on") as on_url:
        urls = {"direct": fake.url, "off": off_url, "on": on_url}
        asyncio.run(one_at_a_time(urls, 2))  # warm-up
        latencies = asyncio.run(one_at_a_time(urls, args.seconds))
    each = len(latencies[("on", False)])
    print(f"c=1, {args.seconds:g} s, {each} requests of each kind to each, no faults, "
          f"{args.chunk_delay * 1000:g} ms between streamed events")
    for stream in (False, True):
        direct = statistics.median(latencies[("direct", stream)])
        added: dict[str, float] = {}
        for name in ("direct", "off", "on"):
            values = latencies[(name, stream)]
            p50, p99 = statistics.median(values), percentile(values, 99)
            added[name] = p50 - direct
            extra = f", added p50 {added[name] * 1000:.2f} ms" if name != "direct" else ""
            print(f"  {'streaming' if stream else 'non-streaming':>13} {name:>6}: p50 {p50 * 1000:.2f} ms, "
                  f"p99 {p99 * 1000:.2f} ms{extra}")
        print(f"  {'':>13} retries on - off: added p50 {(added['on'] - added['off']) * 1000:+.2f} ms")
    return 0


def main(argv: list[str] | None = None) -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--ratio", type=float, default=0.3, help="share of first attempts answered 503")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--chunk-delay", type=float, default=0.005, help="seconds between streamed events")
    parser.add_argument("--c1", action="store_true", help="c=1, retries off / on / direct in turn, no faults")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="chatgate-retries-"))
    if args.c1:
        return c1(args, workdir)
    with spawn_fake_deepseek("--chunk-delay", str(args.chunk_delay)) as fake:
        if args.ratio > 0:
            fake.control.config(fault="http_503", fault_ratio=args.ratio, fault_attempts=1)
        with serving(fake.url, workdir, "chatgate") as url:
            asyncio.run(load(url, args.concurrency, 2))  # warm-up
            fake.control.reset()
            if args.ratio > 0:
                fake.control.config(fault="http_503", fault_ratio=args.ratio, fault_attempts=1)
            latencies, errors = asyncio.run(load(url, args.concurrency, args.seconds))
            issued = fake.control.issued(wait_idle=5)["requests"]
    first = [r for r in issued if r["attempt"] == 1]
    failed_first = sum(1 for r in first if r["status"] == 503)
    budget = 0.2 + 0.4  # the waits of 2 retries from a 200 ms base, at most
    p50, p99 = statistics.median(latencies), percentile(latencies, 99)
    print(f"c={args.concurrency}, {args.seconds:g} s, {args.ratio:.0%} of first attempts 503: "
          f"{len(latencies)} answered, {len(errors)} client errors; {failed_first} of {len(first)} first "
          f"attempts answered 503 ({failed_first / max(len(first), 1):.0%}), {len(issued)} attempts in all")
    print(f"latency p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms; "
          f"back-off budget {budget * 1000:.0f} ms (target p99 < {2 * budget * 1000:.0f} ms)")
    for e in sorted(set(errors))[:5]:
        print("  error:", e)
    ok = not errors and p99 < 2 * budget
    print("targets:", "met" if ok else "NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
