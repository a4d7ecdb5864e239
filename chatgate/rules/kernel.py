"""What every family's rules share: a rule is a pure function from the validated request and the family's
context to the problems it finds (`Rule[Req, Ctx]`); `run_rules` runs a family's rules and lists their
problems and warnings in the order a user reads the body (`Ordering`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import orjson
import pydantic

from chatgate.errors import Problem
from chatgate.profiles import ModelProfile
from chatgate.verdict import Verdict

Req = TypeVar("Req")
Model = TypeVar("Model", bound=pydantic.BaseModel)
Ctx = TypeVar("Ctx")

# A rule: what it finds wrong with a request (problems and warnings), given the family's context
Rule = Callable[[Req, Ctx], Iterable[Problem]]

# A model DeepSeek does not serve: refused (400 model_not_found), or forwarded with a warning for a
# deployment in front of a newer DeepSeek ("pass" is the former name of "warn").
UnknownModels = Literal["reject", "warn", "pass"]


@dataclass(frozen=True, slots=True)
class CheckOptions:
    """The validation settings the rules read (docs/configuration.md, `[validation]`)."""

    strict: bool = False  # refuse what is only likely refused (each rule says what)
    unknown_models: UnknownModels = "reject"
    legacy_reasoner_rules: bool = False  # R18-R20 for deepseek-reasoner (retired)

    @property
    def refuse_unknown_models(self) -> bool:
        return self.unknown_models == "reject"


@dataclass(slots=True)  # not frozen: one per request, and frozen costs a call per field
class RuleContext:
    """What every family's context holds; a family's context subclasses it with what its rules read."""

    profile: ModelProfile
    known: bool  # the model has a profile (its limits are known), or is a name DeepSeek maps to one
    options: CheckOptions

    @property
    def strict(self) -> bool:
        return self.options.strict


class Ordering:
    """The order problems are listed in: the model first, then by the item of `seq` (messages, input) they
    are about (a problem's `order` when set, so that it sorts between two items), the sequence itself before
    its items; with `parts`, by content part within an item; everything else last, in rule order."""

    __slots__ = ("_item",)

    def __init__(self, seq: str, parts: bool = False) -> None:
        tail = r"(?:\.content\[(\d+)\])?" if parts else r"()"
        self._item = re.compile(rf"^{re.escape(seq)}(?:\[(\d+)\]{tail})?")

    def key(self, problem: Problem) -> tuple[int, float, int]:
        param = problem.param or ""
        if param == "model":
            return (0, 0, 0)
        if problem.order is not None:
            return (1, problem.order, -1)
        match = self._item.match(param)
        if match is None:
            return (2, 0, 0)
        item, part = match.group(1, 2)
        return (1, -1 if item is None else int(item), -1 if not part else int(part))


def run_rules(rules: Sequence[Rule[Req, Ctx]], request: Req, ctx: Ctx, ordering: Ordering
              ) -> tuple[list[Problem], list[Problem]]:
    """Every rule's findings: (problems, warnings), each in `ordering`'s order (a sort is stable: problems
    about the same place stay in rule order)."""
    found: list[Problem] = []
    for rule in rules:
        found.extend(rule(request, ctx))
    if not found:
        return found, []
    problems = [problem for problem in found if not problem.warning]
    warnings = [problem for problem in found if problem.warning]
    if len(problems) > 1:
        problems.sort(key=ordering.key)
    if len(warnings) > 1:
        warnings.sort(key=ordering.key)
    return problems, warnings


def in_range(name: str, value: float | None, lo: float, hi: float, rule: str, code: str = "out_of_range",
             *, warning: bool = False) -> Iterator[Problem]:
    """A number outside [lo, hi], in OpenAI's words (what DeepSeek's clients match on)."""
    if value is not None and not lo <= value <= hi:
        yield Problem(code, name, f"Invalid '{name}': expected a value in [{lo:g}, {hi:g}], got {value:g}.",
                      rule, warning=warning)


SECOND_READ_BYTES = 256 * 1024  # a larger body with type errors is reported by them alone (read once)


def beside_type_errors(exc: pydantic.ValidationError, body: bytes, needed: Collection[str]
                       ) -> dict[str, Any] | None:
    """The body's object without the top-level fields its type errors are about, for the rules to read the
    rest (one field's type error does not hide the other problems); None when an error is about the body
    itself or a field the rules cannot do without (`needed`: the model, the messages), or the body is
    large."""
    if len(body) > SECOND_READ_BYTES:
        return None
    roots = {error["loc"][0] for error in exc.errors(include_url=False, include_input=False) if error["loc"]}
    if not roots or not roots.isdisjoint(needed):
        return None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    for root in roots:
        data.pop(root, None)
    return data


def checked_beside_type_errors(problems: list[Problem], exc: pydantic.ValidationError, body: bytes,
                               needed: Collection[str], model: type[Model],
                               check: Callable[[Model], Verdict]) -> Verdict:
    """A body with type errors: `problems` (the family's words for them), then what `check` finds in the rest
    of the body (`beside_type_errors`), so that one field's type error does not hide the other problems."""
    data = beside_type_errors(exc, body, needed)
    if data is None:
        return Verdict(problems)
    try:
        rest = model.model_validate(data)
    except pydantic.ValidationError:
        return Verdict(problems)
    checked = check(rest)
    return Verdict([*problems, *checked.problems], checked.warnings, profile=checked.profile)
