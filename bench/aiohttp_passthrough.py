"""The Python floor: minimal FastAPI app forwarding with a bare aiohttp ClientSession (reported only)."""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from bench.common import raise_nofile_limit

UPSTREAM = os.environ.get("BENCH_UPSTREAM", "http://127.0.0.1:9")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=600.0)
    app.state.session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)
    try:
        yield
    finally:
        await app.state.session.close()


app = FastAPI(lifespan=lifespan)


async def _relay(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    try:
        async for chunk in resp.content.iter_any():
            yield chunk
    finally:
        resp.release()


@app.post("/chat/completions")
@app.post("/v1/chat/completions")
async def chat(request: Request) -> Response:
    session: aiohttp.ClientSession = request.app.state.session
    body = await request.body()
    headers = {
        "content-type": "application/json",
        "authorization": request.headers.get("authorization", ""),
    }
    resp = await session.post(UPSTREAM + "/chat/completions", data=body, headers=headers)
    content_type = resp.headers.get("content-type", "application/json")
    if content_type.startswith("text/event-stream"):
        return StreamingResponse(_relay(resp), status_code=resp.status, media_type=content_type)
    try:
        payload = await resp.read()
    finally:
        resp.release()
    return Response(payload, status_code=resp.status, media_type=content_type)


def main() -> None:
    parser = argparse.ArgumentParser(description="aiohttp passthrough (the Python floor)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    os.environ["BENCH_UPSTREAM"] = args.upstream.rstrip("/")
    raise_nofile_limit()
    uvicorn.run(
        "bench.aiohttp_passthrough:app",
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
