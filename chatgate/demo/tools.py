"""The fake DeepSeek's tool APIs: `POST /v1/tools/search`, `/v1/tools/fetch`, `/v1/tools/ocr` (multipart),
`/v1/tools/tts`, `/v1/tools/asr` (multipart), written from spec deepseek-api.md §13.3, never from the
product (nothing from chatgate/ is imported). `FakeDeepSeek.route` hands these paths to `serve`.

- search: `query` 1-128 characters and `count` 1-50 (default 10), else DeepSeek-style 400s. A query with the
  word `nothing` in it finds no results (`"results": []`: a free call); any other finds `count` results.
- fetch: one `url` of at most 8,192 characters → `{"url", "title", "content": Markdown, "offset",
  "next_offset"}`; a URL with `empty` in it reads an empty page (`"content": ""`).
- OCR: a multipart `file` of at most 100 MiB and a `purpose`; one page per form feed (`\\f`) in the file plus
  one; the answer is preceded by `nonstream_keepalive_lines` newline keep-alives (`x-fake-keepalives` per
  request), `chunk_delay` apart; `reset_mid_stream` drops the connection after them.
- TTS: `input` text → audio bytes (`audio/mpeg`), one byte per character after a small header.
- ASR: a multipart `file` of at most 8 MiB → `{"text": …}`.

Faults, keys and records work as for chat (`x-fake-fault`, `FakeState`).
"""

from __future__ import annotations

from typing import Any

import orjson

from chatgate.demo.deepseek import INVALID, Conn, FakeDeepSeek, RecordedRequest, auth_error, error_bytes
from chatgate.demo.files import Refused, parse_multipart
from chatgate.demo.rules import DESERIALIZE

TOOLS = ("search", "fetch", "ocr", "tts", "asr")
PATHS = frozenset(f"/v1/tools/{tool}" for tool in TOOLS)
MiB = 1024 * 1024
OCR_MAX = 100 * MiB
ASR_MAX = 8 * MiB


async def serve(fake: FakeDeepSeek, rec: RecordedRequest, conn: Conn) -> None:
    """A tool request that reached the fake (after recording)."""
    denied = auth_error(rec.headers, fake.state)
    if rec.method != "POST":
        await fake.send_error(rec, conn, 405, error_bytes("Method Not Allowed", INVALID))
    elif denied is not None:
        await fake.send_error(rec, conn, 401, denied)
    else:
        tool = rec.path.rsplit("/", 1)[1]
        await fake.fault_or_answer(rec, conn, lambda fault: ANSWERS[tool](fake, rec, conn, fault))


async def refuse(fake: FakeDeepSeek, rec: RecordedRequest, conn: Conn, message: str) -> None:
    rec.refused = message
    await fake.send_error(rec, conn, 400, error_bytes(message, INVALID))


def json_body(raw: bytes) -> dict[str, Any] | str:
    """The body as an object, or DeepSeek's words for why not."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return f"Failed to parse the request body as JSON: {exc}"
    if not isinstance(data, dict):
        return f"{DESERIALIZE} invalid type: expected struct"
    return data


async def search(fake: FakeDeepSeek, rec: RecordedRequest, conn: Conn, fault: str | None) -> None:
    data = json_body(rec.body)
    if isinstance(data, str):
        await refuse(fake, rec, conn, data)
        return
    query, count = data.get("query"), data.get("count", 10)
    if not isinstance(query, str):
        await refuse(fake, rec, conn, f"{DESERIALIZE} missing field `query`")
    elif not 1 <= len(query) <= 128:
        await refuse(fake, rec, conn, "Invalid query length, the valid range of query length is [1, 128]")
    elif not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 50:
        await refuse(fake, rec, conn, "Invalid count value, the valid range of count is [1, 50]")
    else:
        found = [] if "nothing" in query.split() else [
            {"title": f"Result {n} for {query}", "url": f"https://example.com/{n}", "snippet": f"snippet {n}",
             "date": "2026-11-20", "summary": f"summary {n}", "rerank_score": round(3 - n / count, 3)}
            for n in range(count)]
        await fake.send_json(rec, conn, 200, orjson.dumps({"query": query, "results": found}))


async def fetch(fake: FakeDeepSeek, rec: RecordedRequest, conn: Conn, fault: str | None) -> None:
    data = json_body(rec.body)
    if isinstance(data, str):
        await refuse(fake, rec, conn, data)
        return
    url = data.get("url")
    if not isinstance(url, str):
        await refuse(fake, rec, conn, f"{DESERIALIZE} missing field `url`")
    elif len(url) > 8192:
        await refuse(fake, rec, conn, "Invalid url length, the url must be at most 8192 characters")
    else:
        content = "" if "empty" in url else f"# A page\n\nThe fake DeepSeek read {url}.\n"
        page = {"url": url, "title": "A page", "content": content, "offset": data.get("offset", 0),
                "next_offset": None}
        await fake.send_json(rec, conn, 200, orjson.dumps(page))


def form_parts(rec: RecordedRequest) -> dict[str, bytes] | None:
    """The multipart body's parts by name (None: not a well-formed multipart body), read as the Files API
    reads them."""
    try:
        found = parse_multipart(rec.headers.get("content-type", ""), rec.body)
    except Refused:
        return None
    return {part.name: part.data for part in found}


async def ocr(fake: FakeDeepSeek, rec: RecordedRequest, conn: Conn, fault: str | None) -> None:
    parts = form_parts(rec)
    file = parts.get("file") if parts is not None else None
    if file is None:
        await refuse(fake, rec, conn, "Missing file: upload the document as the multipart field `file`")
        return
    if len(file) > OCR_MAX:
        await refuse(fake, rec, conn, "File too large: the maximum file size is 100MB")
        return
    pages = file.count(b"\f") + 1
    answer = {"pages": [{"index": n, "markdown": f"page {n + 1} of {pages}"} for n in range(pages)],
              "usage": {"pages": pages}}
    lines = int(rec.headers.get("x-fake-keepalives", fake.state.nonstream_keepalive_lines))
    await conn.start(200, {"content-type": "application/json"})
    rec.status = 200
    for index in range(lines):
        if index and await conn.sleep(fake.state.chunk_delay):
            rec.outcome = "client_disconnected"
            return
        await conn.body(b"\n")
    if fault == "reset_mid_stream":
        rec.outcome = "reset"  # returning without more_body=False makes uvicorn drop the connection
        return
    await conn.body(orjson.dumps(answer), more=False)
    rec.outcome = "completed"


async def tts(fake: FakeDeepSeek, rec: RecordedRequest, conn: Conn, fault: str | None) -> None:
    data = json_body(rec.body)
    if isinstance(data, str):
        await refuse(fake, rec, conn, data)
        return
    text = data.get("input")
    if not isinstance(text, str):
        await refuse(fake, rec, conn, f"{DESERIALIZE} missing field `input`")
        return
    audio = b"ID3\x04fake" + bytes(ord(c) % 256 for c in text)
    rec.status, rec.outcome = 200, "completed"
    await conn.respond(200, audio, "audio/mpeg")


async def asr(fake: FakeDeepSeek, rec: RecordedRequest, conn: Conn, fault: str | None) -> None:
    parts = form_parts(rec)
    file = parts.get("file") if parts is not None else None
    if file is None:
        await refuse(fake, rec, conn, "Missing file: upload the audio as the multipart field `file`")
    elif len(file) > ASR_MAX:
        await refuse(fake, rec, conn, "Audio too large: the maximum file size is 8MB")
    else:
        await fake.send_json(rec, conn, 200, orjson.dumps({"text": f"{len(file)} bytes of speech"}))


ANSWERS = {"search": search, "fetch": fetch, "ocr": ocr, "tts": tts, "asr": asr}
