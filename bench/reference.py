"""Reference passthrough: minimal FastAPI app forwarding the body bytes with httpx2 (chatgate's client stack).

No validation, no metering. `--transport aiohttp` (default) uses `httpx_aiohttp.httpx2.AiohttpTransport`,
`--transport httpx` httpx2's own default transport, so both can be compared in one run.
Configuration goes through environment variables so `--workers N` (an import string) sees it too.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx2
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from bench.common import raise_nofile_limit

UPSTREAM = os.environ.get("BENCH_UPSTREAM", "http://127.0.0.1:9")
TRANSPORT = os.environ.get("BENCH_TRANSPORT", "aiohttp")
# Pools large enough for 2,000 concurrent streams; an explicit number because the aiohttp transport
# maps max_connections=None to aiohttp's default of 100.
LIMITS = httpx2.Limits(max_connections=10_000, max_keepalive_connections=1_000, keepalive_expiry=30.0)
TIMEOUT = httpx2.Timeout(connect=10.0, read=600.0, write=60.0, pool=60.0)


def make_client() -> httpx2.AsyncClient:
    if TRANSPORT == "aiohttp":
        from httpx_aiohttp.httpx2 import AiohttpTransport

        return httpx2.AsyncClient(transport=AiohttpTransport(limits=LIMITS), timeout=TIMEOUT)
    if TRANSPORT == "httpx":
        return httpx2.AsyncClient(limits=LIMITS, timeout=TIMEOUT)
    raise SystemExit(f"unknown transport {TRANSPORT!r}")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    app.state.client = make_client()
    try:
        yield
    finally:
        await app.state.client.aclose()


app = FastAPI(lifespan=lifespan)


@app.post("/chat/completions")
@app.post("/v1/chat/completions")
async def chat(request: Request) -> Response:
    client: httpx2.AsyncClient = request.app.state.client
    body = await request.body()
    headers = {
        "content-type": "application/json",
        "authorization": request.headers.get("authorization", ""),
    }
    upstream_request = client.build_request(
        "POST", UPSTREAM + "/chat/completions", content=body, headers=headers
    )
    resp = await client.send(upstream_request, stream=True)
    content_type = resp.headers.get("content-type", "application/json")
    if content_type.startswith("text/event-stream"):
        return StreamingResponse(
            resp.aiter_raw(),
            status_code=resp.status_code,
            media_type=content_type,
            background=BackgroundTask(resp.aclose),
        )
    try:
        payload = await resp.aread()
    finally:
        await resp.aclose()
    return Response(payload, status_code=resp.status_code, media_type=content_type)


def main() -> None:
    parser = argparse.ArgumentParser(description="reference passthrough (FastAPI + httpx2)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--transport", choices=("aiohttp", "httpx"), default="aiohttp")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    os.environ["BENCH_UPSTREAM"] = args.upstream.rstrip("/")
    os.environ["BENCH_TRANSPORT"] = args.transport
    raise_nofile_limit()
    uvicorn.run(
        "bench.reference:app",
        host=args.host,
        port=args.port,
        workers=args.workers,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
