"""What one call of a tool API is billed for, read from DeepSeek's answer (and, for TTS, the request):
docs/metering.md#tool-calls.

Search and fetch: one call when it returned something; an empty result is free (an error or a timeout has no
answer to read, and is free too). OCR: its pages. TTS: the characters of its text. ASR: no unit known. An
answer of another shape than the one known is counted as one call (pages) and flagged estimated.
"""

from __future__ import annotations

from typing import Any

import orjson

from chatgate.metering.calls import ToolUnits


def _parsed(answer: bytes) -> Any:
    try:
        return orjson.loads(answer)
    except orjson.JSONDecodeError:
        return None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def search_units(answer: bytes) -> ToolUnits:
    data = _parsed(answer)
    results = data.get("results") if isinstance(data, dict) else None
    if isinstance(results, list):
        return ToolUnits("search", 1 if results else 0)
    return ToolUnits("search", 1, estimated=True)


def fetch_units(answer: bytes) -> ToolUnits:
    data = _parsed(answer)
    if data is None:  # the Markdown itself
        return ToolUnits("fetch", 1 if answer.strip() else 0)
    content = data.get("content") if isinstance(data, dict) else None
    if isinstance(content, str):
        return ToolUnits("fetch", 1 if content.strip() else 0)
    return ToolUnits("fetch", 1, estimated=True)


def ocr_units(answer: bytes) -> ToolUnits:
    data = _parsed(answer)
    if isinstance(data, dict):
        pages = data.get("pages")
        if isinstance(pages, list):
            return ToolUnits("ocr", len(pages))
        usage = data.get("usage")
        counted = _count(usage.get("pages")) if isinstance(usage, dict) else None
        if counted is not None:  # DeepSeek: its OCR usage "is not used for billing"
            return ToolUnits("ocr", counted, estimated=True)
    return ToolUnits("ocr", 1, estimated=True)


def tts_units(request: dict[str, Any]) -> ToolUnits:
    """The characters of the text to speak (`input`, else `text`); how DeepSeek counts characters is not
    documented, so the figure is flagged estimated."""
    text = request.get("input", request.get("text"))
    return ToolUnits("tts", len(text) if isinstance(text, str) else 0, estimated=True)


def billed_units(tool: str, request: dict[str, Any], answer: bytes) -> ToolUnits:
    """A successful (200) call's billed units."""
    if tool == "search":
        return search_units(answer)
    if tool == "fetch":
        return fetch_units(answer)
    if tool == "ocr":
        return ocr_units(answer.strip())
    if tool == "tts":
        return tts_units(request)
    return ToolUnits(tool, 0)
