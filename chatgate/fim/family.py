"""The FIM ("fill in the middle") completion family as the gateway sees it (chatgate/gateway/family.py).

DeepSeek serves FIM on its Beta base only: `POST /beta/completions` (docs/rules-fim.md). chatgate
serves it there (and under /v1/beta), checks it with the F-rules (rules.py), forwards it byte for byte
and meters it like chat. FIM has no repairs and no turns to remember. `/v1/completions` and `/completions`
are not DeepSeek routes: `not_on_beta` is their 404, saying where FIM is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chatgate.errors import APIError
from chatgate.fim.rules import check_fim
from chatgate.fim.stream import FimStreamMeter
from chatgate.gateway.family import FamilyBase, NotServed
from chatgate.openai.chat import ChatFamily
from chatgate.rules.models import Policy
from chatgate.sse import LineWatcher
from chatgate.verdict import Verdict

FIM_ROUTE = "/beta/completions"
NOT_ON_BETA = ("/v1/completions", "/completions")  # what clients try when base_url lacks /beta


def not_on_beta(path: str, origin: str | None = None) -> APIError:
    """The 404 for `/v1/completions` and `/completions`: FIM is a Beta feature, served on /beta."""
    base = f"{origin}/beta" if origin else "…/beta"
    return APIError(404, f"Unknown route: {path}. FIM (fill-in-the-middle) completions are a DeepSeek Beta "
                         f"feature served on /beta only: set base_url to {base} (POST {base}/completions).",
                    "invalid_request_error", None, "not_found")


class FimFamily(FamilyBase):
    name = "openai-fim"
    turn_kind = "fim"
    routes: Sequence[tuple[str, str, str, bool]] = (
        ("/beta/completions", FIM_ROUTE, FIM_ROUTE, True),
        ("/v1/beta/completions", FIM_ROUTE, FIM_ROUTE, True),
    )
    validate_routes: Sequence[tuple[str, bool]] = (
        ("/beta/completions/validate", True), ("/v1/beta/completions/validate", True),
    )
    not_served: NotServed = tuple((path, not_on_beta) for path in NOT_ON_BETA)  # FIM is on /beta only

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def check(self, body: bytes, *, beta: bool, origin: str | None, parse: object = None) -> Verdict:
        checked = check_fim(body, self.policy, parse)
        req = checked.request
        if req is None:
            return Verdict(checked.problems, checked.warnings, profile=checked.profile)
        return Verdict(checked.problems, checked.warnings, req.model, req.stream is True, False, False,
                       req.max_tokens, checked.profile)

    # usage is asked for in a stream, and hidden from a client that did not ask, as on the chat route
    ask_stream_usage = ChatFamily.ask_stream_usage
    usage_filter = ChatFamily.usage_filter

    def meter(self, watcher: LineWatcher | None = None) -> FimStreamMeter:
        return FimStreamMeter()  # FIM answers have no turns to remember: no one else watches its lines

    def prompt_text(self, data: dict[str, Any]) -> str:
        return prompt_text(data)


def prompt_text(body: dict[str, Any]) -> str:
    """What the model reads: the prompt, then the suffix."""
    parts = (body.get("prompt"), body.get("suffix"))
    return "".join(part for part in parts if isinstance(part, str))
