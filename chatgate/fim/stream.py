"""The FIM completion stream as chatgate relays it: `text_completion` chunks whose text is in
`choices[].text` (not a `delta`), usage on the last chunk, `data: [DONE]` at the end (DOC-fim).

The meter is the chat meter's base (chatgate/openai/stream.py `ChunkMeter`: regex scans over 16 KB batches,
only events carrying `usage` parsed as JSON) with FIM's text, kept as raw JSON-escaped strings for a local
estimate.
"""

from __future__ import annotations

import re

from chatgate.openai.stream import ChunkMeter
from chatgate.sse import JSON_STRING, collect, decode

_TEXT = re.compile(rb'"text"' + JSON_STRING)


class FimStreamMeter(ChunkMeter):
    """Watches relayed FIM SSE bytes: finds the chunk carrying `usage`, keeps `choices[].text` for
    estimates, notes `[DONE]` and whether the last event was an error."""

    __slots__ = ()

    @property
    def text(self) -> str:
        self._settle()
        return decode(self._text_raw)

    @property
    def reasoning(self) -> str:
        return ""  # FIM is non-thinking only

    def _scan(self, batch: bytes) -> None:
        collect(self._text_raw, _TEXT.findall(batch))
        self._scan_end(batch)
