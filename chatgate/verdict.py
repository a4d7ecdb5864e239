"""What an API family's rules found in a request, in the terms the gateway acts on."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from chatgate.errors import Problem
from chatgate.profiles import ModelProfile


@dataclass(slots=True)  # not frozen: one or two per request, and frozen costs a call per field
class Verdict:
    problems: list[Problem]
    warnings: list[Problem] = field(default_factory=list)
    model: str | None = None  # None when the body could not be read that far
    stream: bool = False
    thinking: bool = False  # the request runs in thinking mode
    tools: bool = False  # the request defines tools (its answer may end in tool calls)
    max_tokens: int | None = None
    profile: ModelProfile | None = None
    media: bool = True  # the body may hold images (False: certainly none, so they need not be looked for)
    request: Any = None  # the family's validated request (its in-place restore reads it), when there is one
    # the model's answers in the history as the family's rules found them, (position, message): what agent
    # runs read of it (chatgate/runs/history.py), when the family has them
    answers: Sequence[tuple[int, Any]] | None = None

    def without_problems(self) -> Verdict:
        """The same verdict with no problems left (a repair fixed them all)."""
        return dataclasses.replace(self, problems=[])


class Rules(Protocol):
    """An API family's checks (chatgate/gateway/family.py: what else a family provides)."""

    name: str

    def check(self, body: bytes, *, beta: bool, origin: str | None, parse: object = None) -> Verdict:
        """The body's problems and what the gateway needs of it; `parse`: R1's parse of `body` (JSON values
        as jiter reads them), validated instead of the bytes when given."""
