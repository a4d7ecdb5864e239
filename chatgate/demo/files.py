"""The fake DeepSeek's Files API (`/files…`, also under `/v1` as DeepSeek's base URL allows).

Written from DeepSeek's Files API guide (api-docs.deepseek.com/guides/files_api, mirror fetched 2026-09-18,
and its zh-cn version), never from the product (nothing from chatgate/ is imported). `FakeDeepSeek.route`
hands these paths to `serve`.

- `POST /files`, `multipart/form-data`: `purpose` (`user_data`; the zh-cn guide adds `text_recognition` and
  `rich_layout_recognition` for documents) sent before `file` (the zh-cn guide: "purpose 字段必须放在 file
  字段之前"), optional `expires_after[anchor]` (`created_at`) with `expires_after[seconds]` (3600 to
  2592000). A file may be at most 64 MiB. The file object: `id` (`file-api-…`), `object`, `bytes`,
  `created_at`, `filename`, `purpose`, and `expires_at` when an expiry was asked for.
- `GET /files`: `after` (a file id), `limit` (1 to 1000, default 1000), `order` (`asc`, the default, or
  `desc`), `purpose`; a list with `first_id`, `last_id`, `has_more`.
- `GET /files/{id}`, `DELETE /files/{id}` (`{"id", "object": "file", "deleted": true}`).
- `GET /files/{id}/content`: the uploaded bytes. DeepSeek's guide documents no download (the zh-cn guide
  says neither the original nor the parse can be downloaded); the fake serves it as OpenAI's shape does,
  so that a download through chatgate can be tested. It is sent in CONTENT_CHUNK pieces.

The Anthropic-format Files API, under `/anthropic/v1/files` (DeepSeek's Anthropic guide: the
`anthropic-beta: files-api-2025-04-14` header is required there; the shapes are Anthropic's Files API's):
an upload takes `file` alone; the file object is `{type: "file", id: "file_…", filename, mime_type,
size_bytes, created_at (RFC 3339), downloadable}`; a list takes `page` (a cursor) and `limit` (1 to 1000,
default 20) and answers `{data, first_id, last_id, has_more, next_page}`; a delete answers `{id, type:
"file_deleted"}`; errors are `{type: "error", error: {type, message}}`. Its files are apart from the
others (neither list shows the other's).

Files belong to the API key that uploaded them: another key gets the 404 of an unknown id. The error texts
are guesses in DeepSeek's error shape; the guide quotes none. The file's format is not checked. Faults work
as for chat (`x-fake-fault`: the error faults, `slow`, `no_headers`; `reset_mid_stream` cuts a download),
and `x-fake-chunk-delay` spaces a download's pieces.
"""

from __future__ import annotations

import itertools
import secrets
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import orjson

from chatgate.demo.deepseek import (
    INVALID,
    Conn,
    FakeDeepSeek,
    RecordedRequest,
    auth_error,
    error_bytes,
    header_float,
)

ANTHROPIC_PREFIX = "/anthropic/v1/files"
PREFIXES = ("/v1/files", "/files", ANTHROPIC_PREFIX)
FILES_BETA = "files-api-2025-04-14"
ANTHROPIC_LIMIT = (1, 1000, 20)  # least, most, default
PURPOSES = ("user_data", "text_recognition", "rich_layout_recognition")
MAX_FILE_BYTES = 64 * 1024 * 1024
EXPIRY_SECONDS = (3600, 2_592_000)
LIST_LIMIT = (1, 1000)
CONTENT_CHUNK = 64 * 1024
NOT_FOUND = "not_found_error"
_SEQUENCE = itertools.count()  # upload order, for files created in the same second


@dataclass
class StoredFile:
    id: str
    owner: str  # the API key that uploaded it
    filename: str
    purpose: str
    content: bytes
    created_at: int
    expires_at: int | None = None
    seq: int = field(default_factory=lambda: next(_SEQUENCE))
    mime_type: str = "application/octet-stream"
    anthropic: bool = False  # uploaded through the Anthropic-format Files API

    def anthropic_obj(self) -> dict[str, Any]:
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created_at))
        return {"type": "file", "id": self.id, "filename": self.filename, "mime_type": self.mime_type,
                "size_bytes": len(self.content), "created_at": created, "downloadable": False}

    def obj(self) -> dict[str, Any]:
        found = {"id": self.id, "object": "file", "bytes": len(self.content), "created_at": self.created_at,
                 "filename": self.filename, "purpose": self.purpose}
        return found if self.expires_at is None else {**found, "expires_at": self.expires_at}


@dataclass
class Part:
    name: str
    filename: str | None
    content_type: str | None
    data: bytes


class Refused(Exception):
    def __init__(self, status: int, message: str, error_type: str = INVALID) -> None:
        super().__init__(message)
        self.status, self.message, self.error_type = status, message, error_type


def owns(path: str) -> bool:
    return any(path == prefix or path.startswith(prefix + "/") for prefix in PREFIXES)


def split(path: str) -> list[str]:
    """The segments after `/files` ([] for the collection)."""
    prefix = next(p for p in PREFIXES if path == p or path.startswith(p + "/"))
    return [segment for segment in path[len(prefix):].split("/") if segment]


def anthropic_error(message: str, error_type: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": error_type, "message": message}})


async def serve(fake: FakeDeepSeek, rec: RecordedRequest, conn: Conn) -> None:
    """A Files API request that reached the fake (after recording)."""
    anthropic = rec.path.startswith(ANTHROPIC_PREFIX)
    if anthropic:
        from chatgate.demo.anthropic import api_key, key_error  # it imports the fake's core, as this does

        denied = key_error(api_key(rec.headers), fake.state)
        if denied is None and FILES_BETA not in rec.headers.get("anthropic-beta", ""):
            denied_beta = anthropic_error(f"The Files API needs the header anthropic-beta: {FILES_BETA}",
                                          "invalid_request_error")
            await fake.send_error(rec, conn, 400, denied_beta)
            return
    else:
        denied = auth_error(rec.headers, fake.state)
    segments = split(rec.path)
    methods: tuple[str, ...] = {0: ("GET", "POST"), 1: ("GET", "DELETE")}.get(len(segments), ())
    if len(segments) == 2 and segments[1] == "content":
        methods = ("GET",)
    if not methods:
        await fake.send_error(rec, conn, 404, error_bytes("Not Found", INVALID))
    elif rec.method not in methods:
        await fake.send_error(rec, conn, 405, error_bytes("Method Not Allowed", INVALID))
    elif denied is not None:
        await fake.send_error(rec, conn, 401, denied)
    else:
        await fake.fault_or_answer(rec, conn, lambda fault: answer(fake, rec, conn, segments, fault))


async def answer(fake: FakeDeepSeek, rec: RecordedRequest, conn: Conn, segments: list[str],
                 fault: str | None) -> None:
    anthropic = rec.path.startswith(ANTHROPIC_PREFIX)
    try:
        if anthropic:
            await anthropic_operation(fake, rec, conn, segments, fault)
        else:
            await operation(fake, rec, conn, segments, fault)
    except Refused as refused:
        shape = anthropic_error if anthropic else error_bytes
        await fake.send_error(rec, conn, refused.status, shape(refused.message, refused.error_type))


async def anthropic_operation(fake: FakeDeepSeek, rec: RecordedRequest, conn: Conn, segments: list[str],
                              fault: str | None) -> None:
    store: dict[str, StoredFile] = fake.state.files
    owner = rec.auth_key or ""
    if not segments and rec.method == "POST":
        parts = {part.name: part for part in parse_multipart(rec.headers.get("content-type", ""), rec.body)}
        file = parts.get("file")
        if file is None or file.filename is None or not file.data:
            raise Refused(400, "Missing required field: file", "invalid_request_error")
        stored = StoredFile("file_" + secrets.token_hex(12), owner, file.filename, "", file.data,
                            int(time.time()), mime_type=file.content_type or "application/octet-stream",
                            anthropic=True)
        store[stored.id] = stored
        await fake.send_json(rec, conn, 200, orjson.dumps(stored.anthropic_obj()))
        return
    mine = [f for f in store.values() if f.owner == owner and f.anthropic]
    if not segments:
        await fake.send_json(rec, conn, 200, orjson.dumps(anthropic_listing(mine, rec.query)))
        return
    found = next((f for f in mine if f.id == segments[0]), None)
    if found is None:
        raise Refused(404, f"File not found: {segments[0]}", NOT_FOUND)
    if len(segments) == 2:
        await send_content(rec, conn, found.content, fault)
    elif rec.method == "DELETE":
        del store[found.id]
        await fake.send_json(rec, conn, 200, orjson.dumps({"id": found.id, "type": "file_deleted"}))
    else:
        await fake.send_json(rec, conn, 200, orjson.dumps(found.anthropic_obj()))


def anthropic_listing(files: list[StoredFile], query: str) -> dict[str, Any]:
    """Newest first, `limit` at a time; `next_page` is the opaque cursor (`page_…`) of the next page (the
    anthropic SDK's `SyncPageCursor`), `has_more`, `first_id` and `last_id` describe the page."""
    params = {name: values[-1] for name, values in parse_qs(query).items()}
    least, most, default = ANTHROPIC_LIMIT
    limit_text = params.get("limit", str(default))
    if not limit_text.isdigit() or not least <= int(limit_text) <= most:
        raise Refused(400, f"limit: must be an integer in [{least}, {most}]", "invalid_request_error")
    chosen = sorted(files, key=lambda f: (f.created_at, f.seq), reverse=True)
    cursor = params.get("page", "")
    start = int(cursor[5:]) if cursor.startswith("page_") and cursor[5:].isdigit() else 0
    page = chosen[start:start + int(limit_text)]
    more = start + len(page) < len(chosen)
    return {"data": [f.anthropic_obj() for f in page], "first_id": page[0].id if page else None,
            "last_id": page[-1].id if page else None, "has_more": more,
            "next_page": f"page_{start + len(page)}" if more else None}


async def operation(fake: FakeDeepSeek, rec: RecordedRequest, conn: Conn, segments: list[str],
                    fault: str | None) -> None:
    store: dict[str, StoredFile] = fake.state.files
    owner = rec.auth_key or ""
    if not segments and rec.method == "POST":
        stored = upload(rec, owner)
        store[stored.id] = stored
        await fake.send_json(rec, conn, 200, orjson.dumps(stored.obj()))
        return
    if not segments:
        mine = [f for f in store.values() if f.owner == owner and not f.anthropic]
        await fake.send_json(rec, conn, 200, orjson.dumps(listing(mine, rec.query)))
        return
    found = store.get(segments[0])
    if found is None or found.owner != owner or found.anthropic:
        raise Refused(404, f"No such file: {segments[0]}", NOT_FOUND)
    if len(segments) == 2:
        await send_content(rec, conn, found.content, fault)
    elif rec.method == "DELETE":
        del store[found.id]
        deleted = {"id": found.id, "object": "file", "deleted": True}
        await fake.send_json(rec, conn, 200, orjson.dumps(deleted))
    else:
        await fake.send_json(rec, conn, 200, orjson.dumps(found.obj()))


async def send_content(rec: RecordedRequest, conn: Conn, content: bytes, fault: str | None) -> None:
    """The bytes in CONTENT_CHUNK pieces, `x-fake-chunk-delay` seconds apart; `reset_mid_stream` drops the
    connection after the first half."""
    rec.status = 200
    await conn.start(200, {"content-type": "application/octet-stream", "content-length": str(len(content))})
    delay = header_float(rec.headers, "x-fake-chunk-delay", 0.0)
    cut = len(content) // 2 if fault == "reset_mid_stream" else len(content)
    for start in range(0, cut, CONTENT_CHUNK):
        if start and await conn.sleep(delay):
            rec.outcome = "client_disconnected"
            return
        await conn.body(content[start:min(start + CONTENT_CHUNK, cut)])
    if cut < len(content):
        rec.outcome = "reset"  # returning without more_body=False makes uvicorn drop the connection
        return
    await conn.body(b"", more=False)
    rec.outcome = "completed"


# ------------------------------------------------------------------------------------------- upload


def upload(rec: RecordedRequest, owner: str) -> StoredFile:
    parts = parse_multipart(rec.headers.get("content-type", ""), rec.body)
    names = [part.name for part in parts]
    fields = {part.name: part for part in parts}
    if "file" not in fields or fields["file"].filename is None:
        raise Refused(400, "Missing required field: file")
    if "purpose" not in fields:
        raise Refused(400, "Missing required field: purpose")
    if names.index("purpose") > names.index("file"):
        raise Refused(400, "The purpose field must come before the file field")
    purpose = fields["purpose"].data.decode("utf-8", "replace")
    if purpose not in PURPOSES:
        raise Refused(400, f"Invalid purpose: {purpose!r}, expected one of {', '.join(PURPOSES)}")
    file = fields["file"]
    if not file.data:
        raise Refused(400, "The uploaded file is empty")
    if len(file.data) > MAX_FILE_BYTES:
        raise Refused(413, f"File too large: at most {MAX_FILE_BYTES} bytes")
    now = int(time.time())
    expires_at = expiry(fields, now)
    file_id = "file-api-" + secrets.token_hex(8)
    return StoredFile(file_id, owner, file.filename or "", purpose, file.data, now, expires_at)


def expiry(fields: dict[str, Part], now: int) -> int | None:
    anchor, seconds = fields.get("expires_after[anchor]"), fields.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if anchor is None or seconds is None:
        raise Refused(400, "expires_after[anchor] and expires_after[seconds] must be given together")
    if anchor.data != b"created_at":
        raise Refused(400, "expires_after[anchor] must be created_at")
    text = seconds.data.decode("ascii", "replace")
    if not text.isdigit() or not EXPIRY_SECONDS[0] <= int(text) <= EXPIRY_SECONDS[1]:
        raise Refused(400, f"expires_after[seconds] must be an integer in [{EXPIRY_SECONDS[0]}, "
                           f"{EXPIRY_SECONDS[1]}]")
    return now + int(text)


def parse_multipart(content_type: str, body: bytes) -> list[Part]:
    """The parts of a `multipart/form-data` body (RFC 7578), or Refused if it is not one, or is cut short."""
    media, _, params = content_type.partition(";")
    boundary = dict(_param(p) for p in params.split(";") if "=" in p).get("boundary")
    if media.strip().lower() != "multipart/form-data" or not boundary:
        raise Refused(400, "Content-Type must be multipart/form-data with a boundary")
    delimiter = b"\r\n--" + boundary.encode("latin-1")
    sections = (b"\r\n" + body).split(delimiter)
    if len(sections) < 3 or sections[0] or not sections[-1].startswith(b"--"):
        raise Refused(400, "Malformed multipart body")
    parts = []
    for section in sections[1:-1]:
        head, found, data = section.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        if not found:
            raise Refused(400, "Malformed multipart body")
        headers = {}
        for line in head.decode("utf-8", "replace").split("\r\n"):
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        disposition = dict(_param(p) for p in headers.get("content-disposition", "").split(";") if "=" in p)
        if "name" not in disposition:
            raise Refused(400, "Malformed multipart body: a part has no name")
        parts.append(Part(disposition["name"], disposition.get("filename"), headers.get("content-type"),
                          data))
    return parts


def _param(text: str) -> tuple[str, str]:
    name, _, value = text.strip().partition("=")
    return name.strip().lower(), value.strip().strip('"')


# ------------------------------------------------------------------------------------------- list


def listing(files: list[StoredFile], query: str) -> dict[str, Any]:
    params = {name: values[-1] for name, values in parse_qs(query).items()}
    order = params.get("order", "asc")
    if order not in ("asc", "desc"):
        raise Refused(400, f"Invalid order: {order!r}, expected asc or desc")
    limit_text = params.get("limit", str(LIST_LIMIT[1]))
    if not limit_text.isdigit() or not LIST_LIMIT[0] <= int(limit_text) <= LIST_LIMIT[1]:
        raise Refused(400, f"limit must be an integer in [{LIST_LIMIT[0]}, {LIST_LIMIT[1]}]")
    purpose = params.get("purpose")
    chosen = sorted((f for f in files if purpose is None or f.purpose == purpose),
                    key=lambda f: (f.created_at, f.seq), reverse=order == "desc")
    if "after" in params:
        ids = [f.id for f in chosen]
        chosen = chosen[ids.index(params["after"]) + 1:] if params["after"] in ids else []
    page = chosen[:int(limit_text)]
    return {"object": "list", "data": [f.obj() for f in page], "first_id": page[0].id if page else None,
            "last_id": page[-1].id if page else None, "has_more": len(chosen) > len(page)}
