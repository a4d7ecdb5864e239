"""DeepSeek's non-token charges: the tool APIs' calls (search, fetch), pages (OCR) and characters (TTS), and
the searches and fetches a model makes with the server web tools (docs/metering.md#tool-calls): what one
billed unit of each tool is, and how many an answer used. Their prices are dated data in the catalogue
(chatgate/metering/catalogue.toml), priced by `Pricing.call_cost` in the deployment's currency; a tool or a
currency DeepSeek publishes no price for costs None (unknown), never a cost from an exchange rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# What one billed unit of each tool is (ASR: not published)
UNIT_OF: dict[str, str | None] = {"search": "call", "fetch": "call", "ocr": "page", "tts": "character",
                                  "asr": None}
TOOLS = tuple(UNIT_OF)


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
