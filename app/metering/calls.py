"""DeepSeek's non-token charges: the tool APIs' calls (search, fetch), pages (OCR) and characters (TTS), and
the searches and fetches a model makes with the server web tools (docs/metering.md#tool-calls).

The one place their prices live (spec deepseek-api.md §13.3, §13.4, as of 2026-11-15). Only prices DeepSeek
publishes in USD are used: OCR and TTS have only yuan prices, ASR none, so their USD cost is unknown (None)
and their records say so (`unpriced`), never a cost from an exchange rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# $0.75 per 1,000 successful calls, in picoUSD per call (DeepSeek's pricing page and Search guide)
SEARCH_CALL_PICOUSD = 750_000_000
PICOUSD_PER_CALL: dict[str, int | None] = {
    "search": SEARCH_CALL_PICOUSD,
    "fetch": SEARCH_CALL_PICOUSD,
    "ocr": None,  # 1.5 元 per 1,000 pages: no USD price published
    "tts": None,  # 3 元 per 10,000 characters (list price): no USD price published
    "asr": None,  # no price captured
}
# What one billed unit of each tool is
UNIT_OF: dict[str, str | None] = {"search": "call", "fetch": "call", "ocr": "page", "tts": "character",
                                  "asr": None}
TOOLS = tuple(PICOUSD_PER_CALL)
# Searches and fetches the model makes (server web tools) are billed per successful call from
# 2026-11-01 00:00 Beijing time = 2026-10-31 16:00 UTC; free before.
MODEL_CALLS_BILLED_FROM = 1_793_462_400.0


def call_cost_picousd(tool: str, units: int, ts: float) -> int | None:
    """The cost of `units` billed units of `tool` at `ts`; None when DeepSeek publishes no USD price."""
    price = PICOUSD_PER_CALL.get(tool)
    if price is None:
        return None
    return price * units


def model_calls_cost_picousd(calls: ModelCalls, ts: float) -> int:
    """What the searches and fetches a model made cost at `ts` (nothing before they were billed)."""
    if ts < MODEL_CALLS_BILLED_FROM:
        return 0
    return (SEARCH_CALL_PICOUSD * calls.searches) + (SEARCH_CALL_PICOUSD * calls.fetches)


@dataclass(frozen=True, slots=True)
class ModelCalls:
    """The web searches and page reads a model made for one answer; `estimated` when counted from the result
    blocks it returned rather than read from its usage."""

    searches: int = 0
    fetches: int = 0
    estimated: bool = False

    @property
    def total(self) -> int:
        return self.searches + self.fetches

    def __add__(self, other: ModelCalls) -> ModelCalls:
        return ModelCalls(self.searches + other.searches, self.fetches + other.fetches,
                          self.estimated or other.estimated)


@dataclass(frozen=True, slots=True)
class ToolUnits:
    """What one call of a tool API is billed for: `units` of the tool's unit (UNIT_OF), `estimated` when the
    answer did not say it plainly."""

    tool: str
    units: int
    estimated: bool = False


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def server_tool_use(usage: Any) -> ModelCalls | None:
    """The calls an answer's usage reports: `usage.server_tool_use` (`web_search_requests`, and
    `web_fetch_requests` as Anthropic's API spells it); None when the usage does not say."""
    if not isinstance(usage, dict):
        return None
    used = usage.get("server_tool_use")
    if not isinstance(used, dict):
        return None
    return ModelCalls(_count(used.get("web_search_requests")), _count(used.get("web_fetch_requests")))
