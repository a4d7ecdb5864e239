"""A tool API as the gateway sees it (chatgate/gateway/family.py): one family per tool, each on its DeepSeek
path under `/v1/tools/` (and the same without `/v1`). No model, no tokens, no stream, no repairs: its rules
(rules.py), its body (JSON, or a multipart upload read whole) and what its answer is billed for
(answers.py). OpenAI's error shape."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chatgate.errors import Problem
from chatgate.gateway.family import FamilyBase, StreamMeter, ToolRoute
from chatgate.metering.calls import TOOLS, ToolUnits
from chatgate.sse import LineWatcher
from chatgate.tools.answers import billed_units
from chatgate.tools.rules import CHECKS, UPLOADS
from chatgate.verdict import Verdict


class ToolFamily(FamilyBase):
    turn_kind = "tool"

    def __init__(self, tool: str, strict: bool = False) -> None:
        self.name = f"tools-{tool}"
        self.tool_name = tool
        self.tool: ToolRoute | None = ToolRoute(tool, UPLOADS.get(tool, 0))
        label, upstream = f"/tools/{tool}", f"/v1/tools/{tool}"
        self.routes: Sequence[tuple[str, str, str, bool]] = (
            (upstream, label, upstream, False), (label, label, upstream, False))
        self.validate_routes: Sequence[tuple[str, bool]] = ((f"{upstream}/validate", False),
                                                            (f"{label}/validate", False))
        self.strict = strict
        self._check = CHECKS[tool]

    def check(self, body: bytes, *, beta: bool, origin: str | None, parse: object = None) -> Verdict:
        found = self._check(body)
        if self.strict:
            found = [Problem(p.code, p.param, p.message, p.rule) for p in found]
        return Verdict([p for p in found if not p.warning], [p for p in found if p.warning],
                       model=self.tool_name, media=False)

    def billed_units(self, request: dict[str, Any], answer: bytes) -> ToolUnits:
        return billed_units(self.tool_name, request, answer)

    def meter(self, watcher: LineWatcher | None = None) -> StreamMeter:
        raise NotImplementedError("a tool API's answer is not a stream")

    def prompt_text(self, data: dict[str, Any]) -> str:
        return ""


def tool_families(strict: bool) -> list[ToolFamily]:
    return [ToolFamily(tool, strict) for tool in TOOLS]
