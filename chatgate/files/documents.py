"""What an uploaded document will cost when a request names it: DeepSeek bills the parsed document as prompt
tokens (issue 48), so the budget's reservation must count it, and it is counted once, as the upload passes
through (`DocumentCount.feed` sees each piece of the multipart body on its way to DeepSeek; nothing is kept).

Only a plain-text file is counted: its UTF-8 bytes bound its tokens (a token covers at least one byte). Any
other document (a PDF, an office file, a text file with another extension) is not counted: its parse can be
far more text than its bytes (a compressed stream), so a request naming it is reserved at the model's
context window, as is a file chatgate did not see uploaded.
"""

from __future__ import annotations

import codecs
import re

TEXT_EXTENSIONS = frozenset({
    "txt", "md", "markdown", "csv", "tsv", "json", "jsonl", "xml", "html", "htm", "yaml", "yml", "toml",
    "ini", "log", "py", "js", "ts", "java", "c", "h", "cpp", "hpp", "go", "rs", "rb", "php", "sh", "sql",
    "css", "tex",
})
_FILENAME = re.compile(rb'filename="([^"]*)"|filename=([^;\s]+)', re.IGNORECASE)
_BOUNDARY = re.compile(r'boundary="?([^";]+)"?', re.IGNORECASE)
HEADERS_MAX = 16 * 1024  # a part's headers; longer, the upload is not counted


class DocumentCount:
    """The byte size of an upload's file part and whether it is plain UTF-8 text, from the multipart body
    read as it streams by; `tokens` is the bound, or None where none is known."""

    def __init__(self, content_type: str) -> None:
        found = _BOUNDARY.search(content_type) if content_type.lower().startswith("multipart/") else None
        self.delimiter = b"\r\n--" + found.group(1).encode("latin-1") if found else b""
        self.buffer = b"\r\n"  # the first delimiter has no line break before it
        self.state = "skip" if found else "broken"
        self.filename: str | None = None
        self.size = 0
        self.files = 0
        self.text = True
        self.decoder = codecs.getincrementaldecoder("utf-8")()

    def feed(self, chunk: bytes) -> None:
        if self.state == "broken":
            return
        self.buffer += chunk
        while self.state != "broken":
            if self.state == "headers":
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(self.buffer) > HEADERS_MAX:
                        self.state = "broken"
                    return
                name = _FILENAME.search(self.buffer[:end])
                if name is not None:
                    self.files += 1
                    self.filename = (name.group(1) or name.group(2) or b"").decode("utf-8", "replace")
                self.buffer = self.buffer[end + 4:]
                self.state = "data" if name is not None else "skip"
                continue
            at = self.buffer.find(self.delimiter)
            if at < 0:
                keep = len(self.delimiter) - 1
                self._part(self.buffer[:-keep] if len(self.buffer) > keep else b"")
                self.buffer = self.buffer[-keep:] if len(self.buffer) > keep else self.buffer
                return
            self._part(self.buffer[:at])
            if self.state == "data":
                self._end_text()
            rest = self.buffer[at + len(self.delimiter):]
            if len(rest) < 2:
                self.buffer = self.buffer[at:]
                return
            if rest.startswith(b"--"):
                self.state, self.buffer = "done", b""
                return
            self.buffer, self.state = rest[2:], "headers"

    def _part(self, data: bytes) -> None:
        if self.state != "data" or not data:
            return
        self.size += len(data)
        if self.text:
            try:
                self.decoder.decode(data)
            except UnicodeDecodeError:
                self.text = False

    def _end_text(self) -> None:
        try:
            self.decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            self.text = False

    def tokens(self) -> int | None:
        """At most what DeepSeek bills for the document in a request, or None (not known)."""
        if self.state != "done" or self.files != 1 or not self.text or self.filename is None:
            return None
        extension = self.filename.rsplit(".", 1)[-1].lower() if "." in self.filename else ""
        if extension not in TEXT_EXTENSIONS:
            return None
        return self.size + len(self.filename.encode())
