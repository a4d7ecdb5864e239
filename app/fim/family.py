"""The FIM ("fill in the middle") completion family as the gateway sees it (app/gateway/family.py).

DeepSeek serves FIM on its Beta base only: `POST /beta/completions` (docs/rules-fim.md). chatgate
serves it there (and under /v1/beta), checks it with the F-rules (rules.py), forwards it byte for byte
and meters it like chat. FIM has no repairs and no turns to remember. `/v1/completions` and `/completions`
are not DeepSeek routes: `not_on_beta` is their 404, saying where FIM is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson

from app.errors import APIError, Problem
from app.fim.rules import check_fim
from app.fim.stream import FimStreamMeter
from app.metering.usage import TokenCounts, tokens_from_usage
from app.openai.rules import Policy
from app.openai.stream import UsageStripper
from app.profiles import ModelProfile
from app.repair.base import Applied, InPlace, RepairOptions, Turn
from app.sse import LineWatcher
from app.verdict import Verdict

FIM_ROUTE = "/beta/completions"
NOT_ON_BETA = ("/v1/completions", "/completions")  # what clients try when base_url lacks /beta


class NoTurns:
    """FIM answers are text, never tool calls: nothing to remember."""

    def lines(self, batch: bytes) -> None:
        return None

    def turn(self, reasoning: Callable[[], str]) -> Turn | None:
        return None


class FimFamily:
    name = "openai-fim"
    turn_kind = "fim"
    restore_codes: frozenset[str] = frozenset()
    restore_repair: str | None = None
    routes: Sequence[tuple[str, str, str, bool]] = (
        ("/beta/completions", FIM_ROUTE, FIM_ROUTE, True),
        ("/v1/beta/completions", FIM_ROUTE, FIM_ROUTE, True),
    )
    validate_routes: Sequence[tuple[str, bool]] = (
        ("/beta/completions/validate", True), ("/v1/beta/completions/validate", True),
    )

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def check(self, body: bytes, *, beta: bool, origin: str | None) -> Verdict:
        checked = check_fim(body, self.policy)
        req = checked.request
        if req is None:
            return Verdict(checked.problems, checked.warnings, profile=checked.profile)
        return Verdict(checked.problems, checked.warnings, req.model, req.stream is True, False, False,
                       req.max_tokens, checked.profile)

    def repairable(self, found: Sequence[Problem], options: RepairOptions) -> bool:
        return False

    def turns_to_restore(self, data: dict[str, Any], found: Sequence[Problem], options: RepairOptions
                         ) -> dict[int, tuple[tuple[str, ...], tuple[str, ...]]]:
        return {}

    def restore_in_place(self, body: bytes, verdict: Verdict, options: RepairOptions) -> InPlace | None:
        return None

    def turn_of(self, data: dict[str, Any], problem: Problem) -> tuple[str, ...] | None:
        return None

    def repair(self, data: dict[str, Any], found: Sequence[Problem], options: RepairOptions,
               profile: ModelProfile | None, recalled: dict[int, str]) -> list[Applied]:
        return []

    def render_error(self, error: APIError, request_id: str | None) -> tuple[bytes, dict[str, str]]:
        return error.to_json(), {}

    def stream_error(self, error: APIError) -> bytes:
        return b"data: " + orjson.dumps({"error": error.body()["error"]}) + b"\n\n"

    def usage(self, answer: Any) -> TokenCounts | None:
        return tokens_from_usage(answer.get("usage")) if isinstance(answer, dict) else None

    def served_model(self, answer: Any) -> str | None:
        return None

    def answer_turn(self, answer: Any) -> Turn | None:
        return None

    def meter(self, watcher: LineWatcher | None = None) -> FimStreamMeter:
        return FimStreamMeter()  # FIM answers have no turns to remember: no one else watches its lines

    def stream_turns(self) -> NoTurns:
        return NoTurns()

    def prompt_text(self, data: dict[str, Any]) -> str:
        return prompt_text(data)

    def ask_stream_usage(self, data: dict[str, Any]) -> bytes | None:
        options = data.get("stream_options") or {}
        if not data or not isinstance(options, dict) or options.get("include_usage") is True:
            return None  # asked already, or a body chatgate did not validate: leave it alone
        return orjson.dumps({**data, "stream_options": {**options, "include_usage": True}})

    def usage_filter(self) -> UsageStripper:
        return UsageStripper()


def prompt_text(body: dict[str, Any]) -> str:
    """What the model reads: the prompt, then the suffix."""
    parts = (body.get("prompt"), body.get("suffix"))
    return "".join(part for part in parts if isinstance(part, str))


def not_on_beta(path: str, origin: str | None = None) -> APIError:
    """The 404 for `/v1/completions` and `/completions`: FIM is a Beta feature, served on /beta."""
    base = f"{origin}/beta" if origin else "…/beta"
    return APIError(404, f"Unknown route: {path}. FIM (fill-in-the-middle) completions are a DeepSeek Beta "
                         f"feature served on /beta only: set base_url to {base} (POST {base}/completions).",
                    "invalid_request_error", None, "not_found")
