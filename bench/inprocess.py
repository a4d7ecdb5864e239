"""Scenario 11's twins in one process, without HTTP: where restore_reasoning's cost is, quickly.

Two chatgate apps (`create_app`, restore on and off, each with its SQLite store and spool) are called
through ASGI directly, with an httpx2 MockTransport as DeepSeek (the fake upstream's tool-call and
content answers, bench/upstream.py). Each runs `--conc` conversations of scenario 11's tool loop: round 1
is answered with a tool call; round 2 comes back without the reasoning to the restore-on app and with it
to the other (the bytes DeepSeek gets are then the same). Blocks of loops alternate between the apps;
each block's CPU time (process_time) per loop is kept, and the medians give the ratio.

It comes close to the server's ratio (0.85 on the host of 2026-12-01, against 0.86 from `bench.run --only
11`; on a later, faster host 0.82-0.85 against 0.87-0.89, with no server costs in the base) in about 20 s,
with no uvicorn, sockets or load generator in the numbers, so `--profile` can say where the extra time goes.
On a busy host it scatters far more than the server's side-by-side rounds (0.74-0.92 in four runs on the
host of 2026-12-02): to tell whether a change is measurable, use `python -m bench.pair`.
Both apps share one process and Python's default garbage-collector settings: with `chatgate serve`'s
(`chatgate.cli.tune_gc`) a collection's cost lands on whichever app's block triggers it, and the ratio moved
to 0.78-0.80 in two runs, so they are not applied.

    python -m bench.inprocess                       # the ratio (median of 10 blocks of 400 loops each)
    python -m bench.inprocess --send-reasoning      # the restore-on app also gets the reasoning back:
                                                    # what remembering the turns alone costs
    python -m bench.inprocess --profile on          # cProfile of one app's loops, by own time
    python -m bench.inprocess --stream              # the streamed tool loop (SSE answers), with any of these

The host's noise moves a ratio by a few percent from run to run on a quiet host, by tens on a busy one:
compare runs of the same kind.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import itertools
import pstats
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
import orjson
import uvloop

from bench import upstream as fake
from bench.toolloop import parse_answer, round1, round2

CHUNKS = 10  # the fake upstream's default (scenario 11 runs it so)
App = Callable[[dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
               Awaitable[None]]


class Upstream:
    """DeepSeek as scenario 11's upstream answers: a tool call, then (once the tool answered) content."""

    def __init__(self) -> None:
        self.tool, self.content, self.ids = fake.tool_call_json(), fake.completion_json(), itertools.count()
        self.tool_stream = b"".join(fake.tool_stream_events(CHUNKS))
        self.content_stream = b"".join(fake.stream_events(CHUNKS))

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        stream = b'"stream":true' in request.content
        if b'"role":"tool"' in request.content:
            raw = self.content_stream if stream else self.content
        else:
            raw = (self.tool_stream if stream else self.tool).replace(
                fake.CALL_PLACEHOLDER, b"call_%016x" % next(self.ids))
        raw = raw.replace(fake.ID_PLACEHOLDER, b"chatcmpl-%016x" % next(self.ids))
        kind = "text/event-stream" if stream else "application/json"
        return httpx2.Response(200, stream=httpx2.ByteStream(raw), headers={"content-type": kind})


def make_app(restore: bool, workdir: str) -> Any:
    from chatgate.settings import load_settings
    from chatgate.web.app import create_app

    env = {"CHATGATE_STORE_URL": f"sqlite:///{workdir}/usage.db",
           "CHATGATE_STORE_SPOOL_DIR": f"{workdir}/spool", "CHATGATE_AUTH_MODE": "passthrough",
           "CHATGATE_SERVER_ACCESS_LOG": "false",
           "CHATGATE_REPAIR_RESTORE_REASONING": "true" if restore else "false"}
    return create_app(load_settings(None, env, {}).settings, transport=httpx2.MockTransport(Upstream()))


async def post(app: App, body: bytes, key: bytes) -> bytes:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000),
             "server": ("127.0.0.1", 8787),
             "headers": [(b"host", b"127.0.0.1:8787"), (b"content-type", b"application/json"),
                         (b"authorization", key), (b"content-length", str(len(body)).encode())]}
    sent: list[dict[str, Any]] = []
    given = False

    async def receive() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client never goes away
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    content = b"".join(m.get("body", b"") for m in sent[1:])
    if sent[0]["status"] != 200:
        raise RuntimeError(f"HTTP {sent[0]['status']}: {content[:300]!r}")
    return content


async def start(app: Any) -> list[Any]:
    """Run the app's lifespan startup; what is returned must be kept alive (the lifespan task)."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})
    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, outbox.put))
    started = await outbox.get()
    if started["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"the app did not start: {started}")
    return [inbox, outbox, task]


async def measure(args: argparse.Namespace) -> None:
    apps = {name: make_app(name == "on", tempfile.mkdtemp(prefix=f"chatgate-inprocess-{name}-"))
            for name in ("on", "off")}
    alive = [await start(app) for app in apps.values()]
    first = round1(args.stream)
    first_raw = orjson.dumps(first)

    async def conversation(name: str, slot: int, loops: int) -> None:
        key = b"Bearer sk-bench-%d" % slot
        back = name == "off" or args.send_reasoning
        for _ in range(loops):
            call, reasoning, _ = parse_answer(await post(apps[name], first_raw, key), args.stream)
            assert call is not None
            await post(apps[name], orjson.dumps(round2(first, call, reasoning if back else None)), key)

    async def loops(name: str, count: int) -> None:
        await asyncio.gather(*(conversation(name, i, count // args.conc) for i in range(args.conc)))

    for name in apps:
        await loops(name, args.warm)
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        await loops(args.profile, args.loops * args.blocks)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(40)
        return
    per_loop: dict[str, list[float]] = {"on": [], "off": []}
    for block in range(args.blocks):
        for name in ("on", "off") if block % 2 == 0 else ("off", "on"):
            t0 = time.process_time()
            await loops(name, args.loops)
            per_loop[name].append((time.process_time() - t0) / args.loops * 1e6)
    on, off = statistics.median(per_loop["on"]), statistics.median(per_loop["off"])
    print(f"restore on {on:.0f} µs per loop, off {off:.0f}: restore costs {on - off:.0f} µs per loop; "
          f"on / off throughput {off / on:.3f}")
    del alive


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--loops", type=int, default=400, help="loops per block")
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--conc", type=int, default=16, help="conversations at once")
    parser.add_argument("--warm", type=int, default=400, help="loops per app before measuring")
    parser.add_argument("--send-reasoning", action="store_true",
                        help="round 2 carries the reasoning to the restore-on app too (remembering alone)")
    parser.add_argument("--stream", action="store_true", help="the streamed tool loop")
    parser.add_argument("--profile", choices=["on", "off"], help="cProfile this app's loops instead")
    uvloop.run(measure(parser.parse_args()))


if __name__ == "__main__":
    main()
