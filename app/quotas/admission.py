"""A request's upper bounds, reserved against its caller's limits before it is forwarded (issue 15): the
tokens (its body's bytes, 384 per image, its max_tokens or the default) and their cost at the hour it
started. The gateway (app/gateway/proxy.py) admits each request here; the ledger settles what it used when
its record is made (app/gateway/ledger.py)."""

from __future__ import annotations

from typing import Protocol

from app.errors import APIError
from app.metering.pricing import Pricing
from app.profiles import ModelProfile
from app.quotas.gate import Quotas, refusal_error
from app.quotas.model import Admission, Refusal
from app.settings import Settings
from app.verdict import Verdict

# A token covers at least one byte of the body, but an image costs up to 384 tokens (docs/rules-chat.md, R9):
# the prompt bound.
IMAGE_TOKENS = 384
IMAGE_MARKERS = (b'"image_url"', b'"input_image"', b'"type":"image"', b'"type": "image"')


class Caller(Protocol):
    @property
    def team(self) -> str: ...

    @property
    def key_id(self) -> str: ...


class Exchange(Protocol):
    """The request as admission sees it (app/gateway/exchange.py)."""

    admission: Admission | None

    @property
    def body(self) -> bytes: ...

    @property
    def model(self) -> str: ...

    @property
    def priced_as(self) -> str: ...

    @property
    def ts(self) -> float: ...

    @property
    def identity(self) -> Caller: ...


class Admitter:
    def __init__(self, quotas: Quotas, settings: Settings, profiles: dict[str, ModelProfile],
                 pricing: Pricing) -> None:
        self.quotas = quotas
        self.settings = settings
        self.profiles = profiles
        self.pricing = pricing
        self.refuse_unpriced = settings.limits.unpriced == "refuse"

    async def admit(self, ex: Exchange, verdict: Verdict | None) -> Refusal | None:
        """Reserve the request's upper bounds against its caller's limits (`ex.admission`), or the refusal."""
        model = ex.priced_as or ex.model

        def bounds(at: float) -> tuple[int, int]:  # only asked when the caller has limits
            profile = verdict.profile if verdict is not None else self.profiles.get(ex.model)
            media = verdict is None or verdict.media
            images = sum(ex.body.count(m) for m in IMAGE_MARKERS) if media and b"image" in ex.body else 0
            prompt = len(ex.body) + IMAGE_TOKENS * images
            top = profile.max_tokens_max if profile is not None else self.settings.limits.default_max_tokens
            wanted = verdict.max_tokens if verdict is not None and verdict.max_tokens is not None else None
            completion = min(wanted if wanted is not None else self.settings.limits.default_max_tokens, top)
            return prompt + completion, self.pricing.bound(prompt, completion, model, at)

        # at the request's start, as its usage record will be priced and counted: a wait for admission that
        # crosses into the peak hours, or into the next budget period, must not reserve by the later time
        priced = not self.refuse_unpriced or self.pricing.rates(model, ex.ts) is not None
        admitted = await self.quotas.admit(ex.identity.team, ex.identity.key_id, bounds, started_at=ex.ts,
                                           priced=priced)
        if isinstance(admitted, Refusal):
            return admitted
        ex.admission = admitted
        return None


def limit_error(refusal: Refusal) -> APIError:
    """The refusal's 429 (or 503), with the caller's rate-limit headers when it has them."""
    error = refusal_error(refusal)
    if refusal.info is not None:
        error.headers.update((k.decode(), v.decode()) for k, v in refusal.info.headers())
    return error
