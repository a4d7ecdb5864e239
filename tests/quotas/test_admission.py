"""A request's admission bounds (chatgate/quotas/admission.py), without a server: the tokens reserved are the
body's bytes, 384 per image, its documents (chatgate/gateway/media.py) and the completion asked for (capped by
the model), priced at the request's start; a refusal leaves the exchange unadmitted and becomes its 429
with the caller's headers."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chatgate.gateway.media import DOCUMENT_OVERHEAD, IMAGE_TOKENS, MediaCounter
from chatgate.quotas.admission import Admitter, limit_error
from chatgate.quotas.model import Refusal
from chatgate.settings import Settings
from chatgate.verdict import Verdict


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
    tool: str | None = None
    media_tokens: int | None = None


class Quotas:
    """Asks the bounds as the gate does, and admits (or refuses) every request."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.asked: list[tuple[str, str, tuple[int, int], float | None]] = []

    async def limited(self, team: str, key_id: str) -> bool:
        return True

    async def admit(self, team: str, key_id: str, bounds: Callable[[float], tuple[int, int]],
                    started_at: float | None = None, priced: bool = True) -> Any:
        self.asked.append((team, key_id, bounds(started_at or 0.0), started_at))
        return self.answer


class Here:
    """The checkers' runner, for bodies checked in the process."""

    async def run(self, size: int, work: Callable[[], Any]) -> Any:
        return work()


class Counts:
    """The store's token counts of uploaded files."""

    def __init__(self, counts: dict[str, int | None]) -> None:
        self.counts = counts

    def file_tokens(self, file_ids: list[str]) -> dict[str, int | None]:
        return {f: self.counts[f] for f in file_ids if f in self.counts}


def admit(body: bytes, verdict: Verdict | None, answer: Any = "admitted",
          counts: dict[str, int | None] | None = None, tool: str | None = None) -> tuple[Ex, Quotas, Any]:
    settings = Settings()
    quotas = Quotas(answer)
    admitter = Admitter(quotas, settings, settings.profiles(), settings.pricing_book("USD"))  # type: ignore[arg-type]
    media = MediaCounter(Here(), Counts(counts or {}), settings.profiles())  # type: ignore[arg-type]
    ex = Ex(body, tool=tool)
    admitted = asyncio.run(admitter.admit(ex, verdict, functools.partial(media.tokens, ex, verdict)))
    if isinstance(admitted, Refusal):
        return ex, quotas, admitted
    ex.admission = admitted
    return ex, quotas, None


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


def test_images_are_counted_from_the_parse_not_the_bytes() -> None:
    """`\\u0069mage_url` is `image_url` to DeepSeek: 600 of them hid from the byte search (issue 48 #3)."""
    image = b'{"type":"\\u0069mage_url","\\u0069mage_url":{"url":"https://x/a.png"}}'
    body = (b'{"model":"deepseek-v4-flash","messages":[{"role":"user","content":['
            + b",".join([image] * 3) + b"]}]}")
    _, quotas, _ = admit(body, None)
    (_, _, (tokens, _), _), = quotas.asked
    top = Settings().profiles()["deepseek-v4-flash"].max_tokens_max
    assert tokens == len(body) + 3 * IMAGE_TOKENS + min(Settings().limits.default_max_tokens, top)


def test_a_document_counts_its_upload_and_one_chatgate_did_not_see_the_context_window() -> None:
    profile = Settings().profiles()["deepseek-v4-flash"]
    verdict = Verdict([], model="deepseek-v4-flash", max_tokens=1, profile=profile)

    def part(file_id: str) -> bytes:
        return b'{"type":"file","file":{"file_id":"' + file_id.encode() + b'"}}'
    body = (b'{"messages":[{"role":"user","content":[' + part("file-counted") + b","
            + part("file-counted") + b"]}]}")
    _, quotas, _ = admit(body, verdict, counts={"file-counted": 50_000})
    (_, _, (tokens, _), _), = quotas.asked
    assert tokens == len(body) + 2 * (50_000 + DOCUMENT_OVERHEAD) + 1, "each mention is billed"
    for counts in ({}, {"file-counted": None}):  # not seen uploaded; seen, count not known
        _, quotas, _ = admit(body, verdict, counts=counts)
        (_, _, (tokens, _), _), = quotas.asked
        assert tokens == len(body) + profile.context_window + 1


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


def test_a_tool_call_reserves_the_price_of_one_call_and_no_tokens() -> None:
    body = b'{"query": "' + b"x" * 100 + b'"}'
    for tool, cost in (("search", 750_000_000), ("fetch", 750_000_000), ("ocr", 1), ("tts", 1), ("asr", 1)):
        _, quotas, _ = admit(body, Verdict([], model=tool), tool=tool)
        assert quotas.asked[0][2] == (0, cost), tool  # OCR, TTS, ASR: no USD price, a budget spent refuses
