"""What every API family needs to turn pydantic's type errors into problems: JSON type names, `param`
paths, the wording of a type error, and the loop that keeps one problem per param."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson
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
    one message), the deeper one where a union also reports the whole value; at most about ERRORS_MAX, in
    time linear in their number (an error lists the first MAX_PROBLEMS of them; repairs may fix them all)."""
    problems: dict[str, Problem] = {}
    wanted: dict[str, list[str]] = {}
    for error in exc.errors(include_url=False):
        problem = problem_of(error)
        key = problem.param or ""
        if key not in problems and len(problems) >= ERRORS_MAX:
            break
        wanted.setdefault(key, []).append(expected.get(error["type"], ""))
        problems.setdefault(key, problem)
    parents = ancestors(problems)
    return [merge_union(p, wanted[p.param or ""]) for p in problems.values() if not shadowed(p, parents)]


ERRORS_MAX = 10_000  # pydantic errors read one by one; beyond, a cut-down copy of the body is checked
CUT_ITEMS = 1_000  # items kept of each array in that copy


def bounded(exc: pydantic.ValidationError, model: type[pydantic.BaseModel], body: bytes
            ) -> pydantic.ValidationError:
    """`exc`, or, when it holds more errors than are worth reading (a body with a million bad items: reading
    them all took seconds and gigabytes), the errors of the same body with every array cut to its first
    items: the first problems, at a cost bounded by the cut."""
    if exc.error_count() <= ERRORS_MAX:
        return exc
    try:
        cut = orjson.dumps(_cut(orjson.loads(body), CUT_ITEMS))
        model.model_validate_json(cut)
    except pydantic.ValidationError as fewer:
        return fewer
    except (orjson.JSONDecodeError, orjson.JSONEncodeError, RecursionError):
        pass
    return exc


def _cut(value: Any, items: int) -> Any:
    if isinstance(value, list):
        return [_cut(v, items) for v in value[:items]]
    if isinstance(value, dict):
        return {k: _cut(v, items) for k, v in value.items()}
    return value


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


def ancestors(params: Iterable[str]) -> set[str]:
    """Every proper prefix of these params that is itself a param path (`stop` of `stop[0]`)."""
    out: set[str] = set()
    for param in params:
        for at, char in enumerate(param):
            if char in ".[" and at:
                out.add(param[:at])
    return out


def shadowed(problem: Problem, parents: set[str]) -> bool:
    """A union (`stop: str | list[str]`) reports the whole value *and* the bad item inside the matching
    member: keep only the deeper, more precise one (`stop[0]`, not `stop`)."""
    return bool(problem.param) and problem.code == "invalid_type" and problem.param in parents


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
