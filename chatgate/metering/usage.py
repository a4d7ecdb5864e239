"""Token counts, and how DeepSeek's OpenAI-format `usage` object gives them
(docs/rules-chat.md#deepseeks-answers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class TokenCounts:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_cache_hit_tokens: int = 0
    prompt_cache_miss_tokens: int = 0
    reasoning_tokens: int = 0


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def tokens_from_usage(usage: Any) -> TokenCounts | None:
    """DeepSeek's fields, with OpenAI's spelling of the cache-hit count as fallback."""
    if not isinstance(usage, dict):
        return None
    prompt = _int(usage.get("prompt_tokens"))
    details = usage.get("prompt_tokens_details")
    hit = usage.get("prompt_cache_hit_tokens")
    if hit is None and isinstance(details, dict):
        hit = details.get("cached_tokens")
    hit_n = _int(hit)
    miss = usage.get("prompt_cache_miss_tokens")
    miss_n = _int(miss) if miss is not None else max(prompt - hit_n, 0)
    completion_details = usage.get("completion_tokens_details")
    reasoning = completion_details.get("reasoning_tokens") if isinstance(completion_details, dict) else None
    return TokenCounts(prompt, _int(usage.get("completion_tokens")), hit_n, miss_n, _int(reasoning))
