"""What every API family needs to turn pydantic's type errors into problems: JSON type names, `param`
paths, the wording of a type error, and the loop that keeps one problem per param."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pydantic

from app.errors import Problem

EXPECTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "content_type": "a string or an array of content parts",
    "finite_number": "a finite number (JSON has no NaN or Infinity)",
}


def problems_of(exc: pydantic.ValidationError, problem_of: Callable[[Any], Problem],
                expected: Mapping[str, str] = EXPECTED) -> list[Problem]:
    """One problem per param (a union reports one param once per member: their expectations are merged into
    one message), the deeper one where a union also reports the whole value."""
    problems: dict[str, Problem] = {}
    wanted: dict[str, list[str]] = {}
    for error in exc.errors(include_url=False):
        problem = problem_of(error)
        key = problem.param or ""
        wanted.setdefault(key, []).append(expected.get(error["type"], ""))
        problems.setdefault(key, problem)
    return [merge_union(p, wanted[p.param or ""]) for p in problems.values() if not shadowed(p, problems)]


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def shadowed(problem: Problem, problems: dict[str, Problem]) -> bool:
    """A union (`stop: str | list[str]`) reports the whole value *and* the bad item inside the matching
    member: keep only the deeper, more precise one (`stop[0]`, not `stop`)."""
    param = problem.param
    if not param or problem.code != "invalid_type":
        return False
    return any(other.startswith((param + ".", param + "[")) for other in problems)


def merge_union(problem: Problem, expected: list[str]) -> Problem:
    if len(expected) < 2 or problem.code != "invalid_type" or not all(expected):
        return problem
    first = f"expected {expected[0]},"
    either = " or ".join(dict.fromkeys(e.replace("an array", "an array of them") for e in expected))
    message = problem.message.replace(first, f"expected {either},")
    return Problem(problem.code, problem.param, message, problem.rule)


def param_of(path: list[Any]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def type_message(kind: str, error: Any, param: str) -> str:
    got = json_type(error.get("input"))
    if kind == "literal_error":
        return f"Invalid value for '{param}': {error['msg']}."
    if kind in ("string_pattern_mismatch", "greater_than_equal", "less_than_equal"):
        return f"Invalid value for '{param}': {error['msg']}."
    expected = EXPECTED.get(kind, "of another type")
    return f"Invalid type for '{param}': expected {expected}, but got {got} instead."
