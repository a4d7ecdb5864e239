"""A request's upper bounds, reserved against its caller's limits before it is forwarded (issue 15): the
tokens (its body's bytes, what its images and documents add (chatgate/gateway/media.py, issue 48), its
max_tokens or the default) and their cost at the hour it
started. The gateway (chatgate/gateway/proxy.py) admits each request here; the ledger settles what it used
when its record is made (chatgate/gateway/ledger.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Protocol

from chatgate.errors import APIError
from chatgate.metering.catalogue import SYMBOLS
from chatgate.metering.pricing import Pricing
from chatgate.profiles import ModelProfile
from chatgate.quotas.gate import Quotas, money_text, refusal_error
from chatgate.quotas.model import Admission, Refusal
from chatgate.settings import Settings
from chatgate.verdict import Verdict

# A tool API call whose USD price is unknown (OCR, TTS, ASR: priced in yuan or not at all) reserves this
# much: not a price, but enough that a budget already spent refuses it (docs/metering.md#tool-calls).
UNKNOWN_CALL_HOLD_PICOUSD = 1

class Caller(Protocol):
    @property
    def team(self) -> str: ...

    @property
    def key_id(self) -> str: ...


class AdmittedRequest(Protocol):
    """The request as admission sees it (chatgate/gateway/exchange.py)."""

    @property
    def body(self) -> bytes: ...

    @property
    def media_tokens(self) -> int | None: ...

    @property
    def model(self) -> str: ...

    @property
    def priced_as(self) -> str: ...

    @property
    def ts(self) -> float: ...

    @property
    def identity(self) -> Caller: ...

    @property
    def tool(self) -> str | None: ...


class Admitter:
    def __init__(self, quotas: Quotas, settings: Settings, profiles: dict[str, ModelProfile],
                 pricing: Pricing) -> None:
        self.quotas = quotas
        self.settings = settings
        self.profiles = profiles
        self.pricing = pricing
        self.refuse_unpriced = settings.limits.unpriced == "refuse"

    async def admit(self, ex: AdmittedRequest, verdict: Verdict | None,
                    media: Callable[[], Awaitable[int]] | None = None) -> Admission | Refusal | None:
        """The request's upper bounds reserved against its caller's limits (its Admission, settled by its
        record), or the refusal; None when no limit applies. `media` counts what its images and documents
        add (asked only when a limit applies)."""
        extra = await media() if media is not None and await self.quotas.limited(
            ex.identity.team, ex.identity.key_id) else 0
        model = ex.priced_as or ex.model
        reserved: list[str] = []  # what the bound is made of, for a budget refusal's message

        def bounds(at: float) -> tuple[int, int]:  # only asked when the caller has limits
            if (tool := ex.tool) is not None:  # a tool API: no tokens, the price of one call
                price = self.pricing.call_cost(tool, 1, at)
                return 0, price if price is not None else UNKNOWN_CALL_HOLD_PICOUSD
            profile = verdict.profile if verdict is not None else self.profiles.get(ex.model)
            prompt = len(ex.body) + extra
            default = self.settings.limits.default_max_tokens
            top = profile.max_tokens_max if profile is not None else default
            wanted = verdict.max_tokens if verdict is not None and verdict.max_tokens is not None else None
            completion = min(wanted if wanted is not None else default, top)
            cost = self.pricing.bound(prompt, completion, model, at)
            reserved[:] = [reservation_text(prompt, extra, completion, wanted,
                                          money_text(cost, SYMBOLS[self.pricing.currency]))]
            return prompt + completion, cost

        # at the request's start, as its usage record will be priced and counted: a wait for admission that
        # crosses into the peak hours, or into the next budget period, must not reserve by the later time
        priced = (not self.refuse_unpriced or ex.tool is not None
                  or self.pricing.rates(model, ex.ts) is not None)
        admitted = await self.quotas.admit(ex.identity.team, ex.identity.key_id, bounds, started_at=ex.ts,
                                           priced=priced)
        if isinstance(admitted, Refusal) and admitted.kind == "budget" and reserved:
            return dataclasses.replace(admitted, message=f"{admitted.message} {reserved[0]}")
        return admitted


def reservation_text(prompt: int, media: int, completion: int, wanted: int | None, cost: str) -> str:
    """What a request's budget reservation is made of, and how to make it smaller."""
    what = f"its body's {prompt - media:,} bytes"
    if media:
        what += f" and {media:,} for its images and documents"
    if wanted is None:
        output = (f"{completion:,} output tokens (no max_tokens was sent: the default, "
                  "limits.default_max_tokens)")
        hint = (" Set max_tokens (max_output_tokens on the Responses API) to what the answer needs, and the "
                "request reserves that much instead.")
    else:
        output = f"{completion:,} output tokens (its max_tokens)"
        hint = " A lower max_tokens reserves less."
    return (f"The reservation: {prompt:,} prompt tokens at most ({what}) + {output} = {cost} at "
            f"this hour's prices.{hint}")


def limit_error(refusal: Refusal) -> APIError:
    """The refusal's 429 (or 503), with the caller's rate-limit headers when it has them."""
    error = refusal_error(refusal)
    if refusal.info is not None:
        error.headers.update((k.decode(), v.decode()) for k, v in refusal.info.headers())
    return error
