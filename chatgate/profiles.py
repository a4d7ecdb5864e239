"""Model profiles: which rules apply to a model and its limits (docs/rules-chat.md#models); prices are in
the catalogue (chatgate/metering/catalogue.toml)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

MAX_V4_OUTPUT = 393_216  # "384K"
CONTEXT_1M = 1_048_576


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

    def updated(self, **changes: Any) -> ModelProfile:
        return replace(self, **changes)


DEFAULT_PROFILES: dict[str, ModelProfile] = {
    p.name: p
    for p in (
        ModelProfile("deepseek-flash", vision=True),
        # Legacy names, still accepted: served by V4.1-Flash (native vision) at the Flash price (NEWS-260910).
        ModelProfile("deepseek-v4-flash", vision=True),
        ModelProfile("deepseek-v4-flash-vision-exp", vision=True),
        ModelProfile("deepseek-v4-pro", vision=False),
        # Retired 2026-07-24, routed to v4-flash (NEWS-260424); clients still send them.
        ModelProfile("deepseek-chat", max_tokens_max=MAX_V4_OUTPUT, thinking_default=False,
                     non_thinking_only=True),
        ModelProfile("deepseek-reasoner", max_tokens_max=MAX_V4_OUTPUT, thinking_only=True,
                     legacy_reasoner=True),
    )
}


def generic_profile(model: str) -> ModelProfile:
    """Models without a profile get the general rules only: no model-specific limit is enforced."""
    return ModelProfile(model, max_tokens_max=2**63 - 1, vision=True)
