"""A request's admission bounds (app/quotas/admission.py), without a server: the tokens reserved are the
body's bytes, 384 per image and the completion asked for (capped by the model), priced at the request's
start; a refusal leaves the exchange unadmitted and becomes its 429 with the caller's headers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.quotas.admission import IMAGE_TOKENS, Admitter, limit_error
from app.quotas.model import Refusal
from app.settings import Settings
from app.verdict import Verdict


@dataclass
class Caller:
    team: str = "team-a"
    key_id: str = "key-1"


@dataclass
class Ex:
    body: bytes
    model: str = "deepseek-v4-flash"
    priced_as: str = ""
    ts: float = 1_800_000_000.0
    identity: Caller = field(default_factory=Caller)
    admission: Any = None


class Quotas:
    """Asks the bounds as the gate does, and admits (or refuses) every request."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.asked: list[tuple[str, str, tuple[int, int], float | None]] = []

    async def admit(self, team: str, key_id: str, bounds: Callable[[float], tuple[int, int]],
                    started_at: float | None = None, priced: bool = True) -> Any:
        self.asked.append((team, key_id, bounds(started_at or 0.0), started_at))
        return self.answer


def admit(body: bytes, verdict: Verdict | None, answer: Any = "admitted") -> tuple[Ex, Quotas, Any]:
    settings = Settings()
    quotas = Quotas(answer)
    admitter = Admitter(quotas, settings, settings.profiles(), settings.pricing_book("USD"))  # type: ignore[arg-type]
    ex = Ex(body)
    refused = asyncio.run(admitter.admit(ex, verdict))
    return ex, quotas, refused


def test_the_bounds_are_the_body_its_images_and_the_completion_capped_by_the_model() -> None:
    settings = Settings()
    profile = settings.profiles()["deepseek-v4-flash"]
    body = (b'{"model":"deepseek-v4-flash","messages":[{"content":[{"type":"image_url"},'
            b'{"type":"image_url"}]}]}')
    verdict = Verdict([], model="deepseek-v4-flash", max_tokens=10 ** 9, profile=profile)
    ex, quotas, refused = admit(body, verdict)
    assert refused is None and ex.admission == "admitted"
    (team, key_id, (tokens, cost), started_at), = quotas.asked
    prompt = len(body) + 2 * IMAGE_TOKENS
    completion = profile.max_tokens_max  # asked for more than the model gives
    assert (team, key_id, started_at) == ("team-a", "key-1", ex.ts)
    assert tokens == prompt + completion
    assert cost == settings.pricing_book("USD").bound(prompt, completion, "deepseek-v4-flash", ex.ts)


def test_without_a_verdict_the_default_max_tokens_and_the_models_profile() -> None:
    settings = Settings()
    body = b'{"model":"deepseek-v4-flash","messages":[]}'
    _, quotas, _ = admit(body, None)
    (_, _, (tokens, _), _), = quotas.asked
    top = settings.profiles()["deepseek-v4-flash"].max_tokens_max
    assert tokens == len(body) + min(settings.limits.default_max_tokens, top)


def test_a_refusal_leaves_the_exchange_unadmitted_and_is_a_429_with_its_headers() -> None:
    refusal = Refusal("rpm", None, 10, 2.5, "Rate limit reached: 10 requests per minute.")
    ex, _, refused = admit(b"{}", None, refusal)
    assert refused is refusal and ex.admission is None
    error = limit_error(refusal)
    assert error.status == 429 and error.headers["retry-after"] == "3"
