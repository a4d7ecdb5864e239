"""Every uploaded file a request names, wherever in the body it names it: managed mode lets a team name its
own files only (owners.py), and a check that looked only where each family usually puts a file
(messages' content) let another team's id through in an Anthropic `system` block or a Responses
`instructions` item.

A file is named by an object with a string `file_id` (DeepSeek's and the SDKs' forms: `{type: file,
file_id}`, `{type: file, file: {file_id}}`, `{type: input_file, file_id}`, `source: {type: file, file_id}`).
What is data rather than request structure is not looked into: a tool call's arguments (`input` of a
`tool_use` block) and schemas (`tools`, `parameters`, `input_schema`, `schema`), and `metadata`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jiter
import orjson

from chatgate.errors import APIError

OPAQUE_KEYS = frozenset({"tools", "parameters", "input_schema", "schema", "json_schema", "metadata"})
TOOL_CALL_BLOCKS = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})


def may_name_files(body: bytes, json: bool = False) -> bool:
    """Whether the body may name a file: it says `file_id`, or escapes a character (`file\\u005fid`). A body
    known to be JSON (`json`: it passed the checks) is not refused as unreadable by `named_files`, and the
    letters of `file_id` escape only as `\\u00XX`: the longer needle is the cheaper search (~9K
    instructions less on a 6 KB body). Searched backward: CPython's `rfind` takes half the time of `in` on
    such bytes (3.2 µs less on a 6 KB body)."""
    return body.rfind(b"file_id") >= 0 or body.rfind(b"\\u00" if json else b"\\u") >= 0


def named_files(body: bytes) -> list[tuple[str, str]]:
    """(param, file id) of each file the body names; a body that cannot be read whole (not JSON, or JSON
    that only a lenient parser reads, such as NaN) is refused (400), never forwarded unchecked."""
    try:
        data = jiter.from_json(body, cache_mode="keys")  # reads 1e400 as infinity, where orjson gives up
    except ValueError as exc:
        raise APIError(400, f"Request body is not valid JSON: {exc}. Send a UTF-8 JSON object.",
                       "invalid_request_error", None, "invalid_json") from None
    if b"file_id" not in body:  # only escapes: is one of them a file_id key?
        try:
            if b'"file_id"' not in orjson.dumps(data):
                return []
        except TypeError:  # an integer beyond 64 bits: look through it all
            pass
    return file_refs(data)


def file_refs(data: Any) -> list[tuple[str, str]]:
    """(param, file id) of each file the body names, in document order."""
    found: list[tuple[str, str]] = []
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, dict):
            file_id = node.get("file_id")
            if isinstance(file_id, str) and file_id:
                found.append((f"{where}.file_id" if where else "file_id", file_id))
            call = node.get("type") in TOOL_CALL_BLOCKS
            children = [(value, f"{where}.{key}" if where else str(key)) for key, value in node.items()
                        if isinstance(value, (dict, list)) and key not in OPAQUE_KEYS
                        and not (call and key == "input")]
            stack.extend(reversed(children))
        elif isinstance(node, list):
            stack.extend(reversed([(value, f"{where}[{i}]") for i, value in enumerate(node)
                                   if isinstance(value, (dict, list))]))
    return found


# What DeepSeek bills beyond a body's own bytes (docs/keys-and-limits.md, the reservation): each image (384
# tokens at most) and each document the body names or carries.
IMAGE_TYPES = frozenset({"image_url", "input_image", "image"})
INLINE_DOCUMENT_TYPES = frozenset({"document", "input_file", "file"})


@dataclass(frozen=True, slots=True)
class Media:
    images: int = 0
    files: tuple[str, ...] = ()  # the uploaded files it names, once per mention (each is billed)
    inline: int = 0  # documents sent in the body itself (`file_data`, a base64 `document` source)


def body_media(body: bytes) -> Media:
    """The images and documents of a body, read from its parse (an escaped `\\u0069mage_url` is an image
    too); a body that is not JSON holds none that DeepSeek would read."""
    try:
        data = jiter.from_json(body, cache_mode="keys")
    except ValueError:
        return Media()
    return media_in(data)


def media_in(data: Any) -> Media:
    """Images and documents anywhere DeepSeek reads content: what `file_refs` looks into, no data."""
    images = inline = 0
    files: list[str] = []
    stack: list[Any] = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            kind = node.get("type")
            if kind in IMAGE_TYPES or (kind is None and isinstance(node.get("image_url"), (dict, str))):
                images += 1
            file_id = node.get("file_id")
            if isinstance(file_id, str) and file_id:
                files.append(file_id)
            elif "file_data" in node or "file_url" in node or (kind in INLINE_DOCUMENT_TYPES
                                                                and _base64_source(node)):
                inline += 1
            call = kind in TOOL_CALL_BLOCKS
            stack.extend(value for key, value in node.items() if isinstance(value, (dict, list))
                         and key not in OPAQUE_KEYS and not (call and key == "input"))
        elif isinstance(node, list):
            stack.extend(value for value in node if isinstance(value, (dict, list)))
    return Media(images, tuple(files), inline)


def _base64_source(node: dict[str, Any]) -> bool:
    source = node.get("source")
    return isinstance(source, dict) and source.get("type") in ("base64", "url")
