"""Open-loop load generator (its own process): requests on a fixed schedule, whatever the answers do.

Request i is sent at t0 + i / rate; its latency is measured from that scheduled time (so a slow server
cannot slow the generator down and hide its own queueing). Prints one JSON line with the served rate,
errors and latency percentiles of the successful requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import aiohttp
import uvloop

from bench.common import AUTH_HEADER, CHAT_PATH, raise_nofile_limit
from bench.stats import summarize_ms


async def run(url: str, body: bytes, rate: float, duration_s: float, timeout_s: float) -> dict[str, object]:
    total = max(1, int(rate * duration_s))
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    late_starts = 0
    headers = {"Content-Type": "application/json", "Authorization": AUTH_HEADER}
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(scheduled: float) -> None:
            try:
                async with session.post(url, data=body, headers=headers) as resp:
                    await resp.read()
                    if resp.status == 200:
                        latencies.append(time.perf_counter() - scheduled)
                    else:
                        errors[f"http_{resp.status}"] += 1
            except TimeoutError:
                errors["timeout"] += 1
            except aiohttp.ClientError as exc:
                errors[type(exc).__name__] += 1

        tasks: list[asyncio.Task[None]] = []
        t0 = time.perf_counter() + 0.05  # perf_counter: uvloop's loop.time() has 1 ms resolution
        for i in range(total):
            scheduled = t0 + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -0.01:
                late_starts += 1
            tasks.append(asyncio.create_task(one(scheduled)))
        send_span = time.perf_counter() - t0
        await asyncio.wait(tasks, timeout=timeout_s + 5.0)
        for task in tasks:
            if not task.done():
                task.cancel()
                errors["unfinished"] += 1
    served = len(latencies)
    result: dict[str, object] = {
        "offered": total,
        "offered_rps": rate,
        "send_span_s": send_span,
        "served": served,
        "served_pct": 100.0 * served / total,
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "late_starts": late_starts,
    }
    result.update(summarize_ms(latencies))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description="open-loop load generator")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default=CHAT_PATH)
    parser.add_argument("--body", type=Path, required=True)
    parser.add_argument("--rate", type=float, required=True, help="requests per second offered")
    parser.add_argument("--duration", type=float, required=True, help="seconds of sending")
    parser.add_argument("--timeout", type=float, default=10.0, help="per-request timeout (s)")
    args = parser.parse_args()
    raise_nofile_limit()
    started = time.monotonic()
    result = uvloop.run(
        run(
            f"http://127.0.0.1:{args.port}{args.path}",
            args.body.read_bytes(),
            args.rate,
            args.duration,
            args.timeout,
        )
    )
    result["wall_s"] = time.monotonic() - started
    print("BENCH_JSON " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
