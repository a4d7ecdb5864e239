"""Model profiles: which rules apply to a model, its limits and its prices (docs/rules-chat.md#models;
docs/metering.md#prices)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

MAX_V4_OUTPUT = 393_216  # "384K"
CONTEXT_1M = 1_048_576


@dataclass(frozen=True, slots=True)
class Prices:
    """USD per 1M tokens at peak; off-peak applies the pricing multiplier (docs/metering.md#prices: half
    price)."""

    input_cache_hit: Decimal
    input_cache_miss: Decimal
    output: Decimal


@dataclass(frozen=True, slots=True)
class ModelProfile:
    name: str
    context_window: int = CONTEXT_1M
    max_tokens_max: int = MAX_V4_OUTPUT
    vision: bool = False
    thinking_default: bool = True
    thinking_only: bool = False  # legacy deepseek-reasoner: always thinking
    non_thinking_only: bool = False  # legacy deepseek-chat: never thinking
    legacy_reasoner: bool = False  # R18-R20 apply (when validation.legacy_reasoner_rules is on)
    prices: Prices | None = None

    def updated(self, **changes: Any) -> ModelProfile:
        return replace(self, **changes)


def _p(hit: str, miss: str, out: str) -> Prices:
    return Prices(Decimal(hit), Decimal(miss), Decimal(out))


FLASH_PRICES = _p("0.006", "0.30", "1.20")  # deepseek-flash peak, from 2026-09-10 (docs/metering.md#prices)
PRO_PRICES = _p("0.044", "1.32", "3.96")  # deepseek-v4-pro peak (docs/metering.md#prices)

DEFAULT_PROFILES: dict[str, ModelProfile] = {
    p.name: p
    for p in (
        ModelProfile("deepseek-flash", vision=True, prices=FLASH_PRICES),
        # Legacy names, still accepted: served by V4.1-Flash (native vision) at the Flash price (NEWS-260910).
        ModelProfile("deepseek-v4-flash", vision=True, prices=FLASH_PRICES),
        ModelProfile("deepseek-v4-flash-vision-exp", vision=True, prices=FLASH_PRICES),
        ModelProfile("deepseek-v4-pro", vision=False, prices=PRO_PRICES),
        # Retired 2026-07-24, routed to v4-flash (NEWS-260424); clients still send them.
        ModelProfile("deepseek-chat", max_tokens_max=MAX_V4_OUTPUT, thinking_default=False,
                     non_thinking_only=True, prices=FLASH_PRICES),
        ModelProfile("deepseek-reasoner", max_tokens_max=MAX_V4_OUTPUT, thinking_only=True,
                     legacy_reasoner=True, prices=FLASH_PRICES),
    )
}


def generic_profile(model: str) -> ModelProfile:
    """Models without a profile get the general rules only: no model-specific limit is enforced."""
    return ModelProfile(model, max_tokens_max=2**63 - 1, vision=True, prices=None)
