"""Streaming measurements (its own process).

`ttfb`: sequential streamed requests at c=1 over one keep-alive connection (aiohttp): time to the first
SSE event and to the end of the stream.
`streams`: N concurrent streams, each on its own raw asyncio connection, so every socket read is seen:
inter-event gaps, events received, and reads that carried more than one event (coalesced chunks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import uvloop

from bench.common import AUTH_HEADER, CHAT_PATH, raise_nofile_limit
from bench.stats import percentile, summarize_ms

DATA = b"data: "
DONE = b"data: [DONE]"


async def ttfb(url: str, body: bytes, count: int, max_s: float) -> dict[str, object]:
    headers = {"Content-Type": "application/json", "Authorization": AUTH_HEADER}
    firsts: list[float] = []
    totals: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=1)
    deadline = time.perf_counter() + max_s
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        for i in range(count + 20):  # the first 20 warm the connection and are not counted
            if time.perf_counter() > deadline:
                break
            start = time.perf_counter()
            first = None
            try:
                async with session.post(url, data=body, headers=headers) as resp:
                    async for chunk in resp.content.iter_any():
                        if first is None and DATA in chunk:
                            first = time.perf_counter()
                    ok = resp.status == 200 and first is not None
            except (TimeoutError, aiohttp.ClientError):
                ok = False
            end = time.perf_counter()
            if i < 20:
                continue
            if ok and first is not None:
                firsts.append(first - start)
                totals.append(end - start)
            else:
                errors += 1
    result: dict[str, object] = {"requests": len(firsts), "errors": errors}
    result.update({"ttfb_" + k: v for k, v in summarize_ms(firsts).items()})
    result.update({"total_" + k: v for k, v in summarize_ms(totals).items()})
    return result


@dataclass
class StreamStats:
    events: int = 0
    reads_with_events: int = 0
    coalesced_reads: int = 0
    gaps: list[float] = field(default_factory=list)
    first_event_s: float | None = None  # from connect to the first event
    duration_s: float | None = None  # from connect to [DONE]
    done: bool = False
    status_ok: bool = False
    error: str | None = None


class StreamProtocol(asyncio.Protocol):
    """One streamed request on its own connection; counts `data: ` occurrences per read."""

    def __init__(self, request: bytes, finished: asyncio.Future[None]) -> None:
        self.request = request
        self.finished = finished
        self.stats = StreamStats()
        self.headers_done = False
        self.head = b""
        self.carry = b""
        self.last_event_at: float | None = None
        self.transport: asyncio.Transport | None = None
        self.connected_at = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.connected_at = time.perf_counter()
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if not self.headers_done:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            self.headers_done = True
            self.stats.status_ok = self.head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200"))
            data = self.head[end + 4 :]
            self.head = b""
            if not data:
                return
        window = self.carry + data
        n = window.count(DATA)
        if n:
            self.stats.events += n
            self.stats.reads_with_events += 1
            if n > 1:
                self.stats.coalesced_reads += 1
            if self.last_event_at is not None:
                self.stats.gaps.append(now - self.last_event_at)
            else:
                self.stats.first_event_s = now - self.connected_at
            self.last_event_at = now
            if DONE in window:
                self.stats.done = True
                self.stats.duration_s = now - self.connected_at
                if self.transport is not None:
                    self.transport.close()
        self.carry = window[-(len(DATA) - 1) :]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.stats.done and self.stats.error is None:
            self.stats.error = f"closed early: {exc}"
        if not self.finished.done():
            self.finished.set_result(None)


async def one_stream(port: int, request: bytes, timeout_s: float) -> StreamStats:
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[None] = loop.create_future()
    proto = StreamProtocol(request, finished)
    try:
        transport, _ = await asyncio.wait_for(
            loop.create_connection(lambda: proto, "127.0.0.1", port), timeout=min(timeout_s, 30.0)
        )
    except (TimeoutError, OSError) as exc:
        proto.stats.error = f"connect: {type(exc).__name__}"
        return proto.stats
    try:
        await asyncio.wait_for(finished, timeout=timeout_s)
    except TimeoutError:
        proto.stats.error = "timeout"
    finally:
        transport.close()
    return proto.stats


async def streams(
    port: int, path: str, body: bytes, count: int, ramp_s: float, timeout_s: float, interval_s: float
) -> dict[str, object]:
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Authorization: {AUTH_HEADER}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    tasks: list[asyncio.Task[StreamStats]] = []
    started = time.perf_counter()
    for i in range(count):
        delay = started + ramp_s * i / count - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one_stream(port, request, timeout_s)))
    results = await asyncio.gather(*tasks)
    import os
    if os.environ.get("STREAMS_DUMP"):
        with open(os.environ["STREAMS_DUMP"], "w") as fh:
            for i, r in enumerate(results):
                fh.write(f"{i} {r.first_event_s} {r.duration_s} {r.error}\n")
    gaps = [g for r in results for g in r.gaps]
    errors: dict[str, int] = {}
    for r in results:
        if r.error:
            key = r.error.split(":")[0]
            errors[key] = errors.get(key, 0) + 1
    added = [g - interval_s for g in gaps]
    firsts = [r.first_event_s for r in results if r.first_event_s is not None]
    durations = [r.duration_s for r in results if r.duration_s is not None]
    return {
        "streams": count,
        "completed": sum(1 for r in results if r.done and r.status_ok),
        "errors": errors,
        "events": sum(r.events for r in results),
        "reads_with_events": sum(r.reads_with_events for r in results),
        "coalesced_reads": sum(r.coalesced_reads for r in results),
        "gap_p50_ms": percentile(gaps, 50) * 1000.0,
        "gap_p99_ms": percentile(gaps, 99) * 1000.0,
        "gap_max_ms": (max(gaps) * 1000.0) if gaps else float("nan"),
        "added_gap_p99_ms": percentile(added, 99) * 1000.0,
        "first_event_p50_ms": percentile(firsts, 50) * 1000.0,
        "first_event_p99_ms": percentile(firsts, 99) * 1000.0,
        "duration_max_s": max(durations) if durations else float("nan"),
        "wall_s": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="streaming measurements")
    parser.add_argument("mode", choices=("ttfb", "streams"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default=CHAT_PATH)
    parser.add_argument("--body", type=Path, required=True)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--max-seconds", type=float, default=30.0, help="ttfb: stop after this long")
    parser.add_argument("--ramp", type=float, default=1.0, help="streams: seconds over which to open them")
    parser.add_argument("--timeout", type=float, default=60.0, help="streams: per-stream timeout (s)")
    parser.add_argument("--interval", type=float, default=0.1, help="streams: upstream event spacing (s)")
    args = parser.parse_args()
    raise_nofile_limit()
    body = args.body.read_bytes()
    if args.mode == "ttfb":
        url = f"http://127.0.0.1:{args.port}{args.path}"
        result = uvloop.run(ttfb(url, body, args.count, args.max_seconds))
    else:
        result = uvloop.run(
            streams(args.port, args.path, body, args.count, args.ramp, args.timeout, args.interval)
        )
    print("BENCH_JSON " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
