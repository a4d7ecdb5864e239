"""Reading a multipart/form-data body (RFC 7578) as it will be forwarded: where each part is, never a copy of
its content. The delimiter is the body's first line, so the body alone says how it is cut."""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = re.compile(rb'(?:^|;)\s*name="([^"]*)"', re.IGNORECASE)
_FILENAME = re.compile(rb'(?:^|;)\s*filename="([^"]*)"', re.IGNORECASE)
MAX_DELIMITER = 72 + 2  # "--" and a boundary of at most 70 characters (RFC 2046)


@dataclass(frozen=True, slots=True)
class Part:
    name: str | None
    filename: str | None
    start: int  # the content's first byte in the body
    end: int  # one past its last

    @property
    def size(self) -> int:
        return self.end - self.start


def parts(body: bytes) -> list[Part] | None:
    """The body's parts in order, or None when it is not a well-formed multipart body."""
    line_end = body.find(b"\r\n", 0, MAX_DELIMITER + 2)
    if not body.startswith(b"--") or line_end < 3:
        return None
    delimiter = b"\r\n" + body[:line_end]
    found: list[Part] = []
    at = line_end + 2
    while True:
        head_end = body.find(b"\r\n\r\n", at)
        if head_end < 0:
            return None
        headers = body[at:head_end]
        end = body.find(delimiter, head_end + 4)
        if end < 0:
            return None
        name, filename = _header_value(headers, _NAME), _header_value(headers, _FILENAME)
        found.append(Part(name, filename, head_end + 4, end))
        after = end + len(delimiter)
        if body[after:after + 2] == b"--":
            return found
        if body[after:after + 2] != b"\r\n":
            return None
        at = after + 2


def _header_value(headers: bytes, pattern: re.Pattern[bytes]) -> str | None:
    for line in headers.split(b"\r\n"):
        if line.lower().startswith(b"content-disposition:"):
            match = pattern.search(line.split(b":", 1)[1])
            return match.group(1).decode("utf-8", "replace") if match else None
    return None
