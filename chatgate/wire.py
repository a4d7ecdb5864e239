"""What every API family needs to turn pydantic's type errors into problems: JSON type names, `param`
paths, the wording of a type error, and the loop that keeps one problem per param."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import orjson
import pydantic
import pydantic_core

from chatgate.errors import Problem

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


FULL_CHECK_BYTES = 256 * 1024  # a larger body is validated failing fast (arrays stop at their first bad item)
CUT_BODY_MAX = 4 << 20  # a larger invalid body is reported by its first error alone (cutting needs a parse)
Model = TypeVar("Model", bound=pydantic.BaseModel)


def validate_body(model: type[Model], body: bytes, parse: object = None) -> Model:
    """`model` from a JSON body; else a ValidationError whose errors cost memory and time bounded by the
    body's size. A body up to FULL_CHECK_BYTES is validated as usual (see `bounded`). A larger one by a copy
    of the schema whose arrays stop at their first bad item: a 13 MB body of a million bad messages held
    1.3 GB of errors while pydantic collected them. When it is invalid, its errors are those of the body with
    every array cut to its first CUT_ITEMS items if that copy is at most FULL_CHECK_BYTES (the first
    problems, all listed), else its first error alone. `parse`: R1's parse of `body`
    (chatgate/gateway/strict.py, jiter: the same values pydantic's JSON parser reads), validated instead of
    reading the bytes again."""
    if len(body) <= FULL_CHECK_BYTES:
        if isinstance(parse, dict):
            try:  # what R1 parsed; an invalid one is validated again from its bytes for today's exact errors
                return model.model_validate(parse)
            except pydantic.ValidationError:
                pass
        try:
            return model.model_validate_json(body)
        except pydantic.ValidationError as exc:
            raise bounded(exc, model, body) from None
    try:
        fields, _, fields_set = _fail_fast(model).validate_json(body)
    except pydantic.ValidationError as first:
        raise _listed(first, model, body) from None
    return model.model_construct(fields_set, **fields)


@functools.cache
def _fail_fast(model: type[pydantic.BaseModel]) -> pydantic_core.SchemaValidator:
    """A validator of the model's fields with `fail_fast` on every array. Its fields, not the model: pydantic
    reuses the model's own validator for a schema of the same class, whatever the schema says."""
    schema: dict[str, Any] = copy.deepcopy(dict(model.__pydantic_core_schema__))
    outer: dict[str, Any] = schema["schema"] if schema["type"] == "definitions" else schema
    if outer["type"] != "model":
        raise TypeError(f"{model.__name__}: a model schema was expected, not {outer['type']!r}")
    fields = outer["schema"]
    _set_fail_fast(fields)
    if schema["type"] == "definitions":
        _set_fail_fast(schema["definitions"])
        fields = {**schema, "schema": fields}
    return pydantic_core.SchemaValidator(fields, outer.get("config"))


def _set_fail_fast(node: Any) -> None:
    if isinstance(node, dict):
        if node.get("type") in ("list", "tuple", "set", "frozenset"):
            node["fail_fast"] = True
        for value in node.values():
            _set_fail_fast(value)
    elif isinstance(node, list):
        for value in node:
            _set_fail_fast(value)


def _listed(first: pydantic.ValidationError, model: type[pydantic.BaseModel], body: bytes
            ) -> pydantic.ValidationError:
    """A large invalid body's errors: its cut copy's if that copy is small enough to check in full."""
    if len(body) > CUT_BODY_MAX:
        return first
    return _cut_errors(model, body, FULL_CHECK_BYTES) or first  # else what is wrong lies beyond the cut


def bounded(exc: pydantic.ValidationError, model: type[pydantic.BaseModel], body: bytes
            ) -> pydantic.ValidationError:
    """`exc`, or, when it holds more errors than are worth reading (a body with a million bad items: reading
    them all took seconds and gigabytes), the errors of the same body with every array cut to its first
    items: the first problems, at a cost bounded by the cut."""
    if exc.error_count() <= ERRORS_MAX:
        return exc
    return _cut_errors(model, body) or exc


def _cut_errors(model: type[pydantic.BaseModel], body: bytes, size_max: int | None = None
                ) -> pydantic.ValidationError | None:
    """The errors of the body with every array cut to its first CUT_ITEMS items; None when that copy is
    valid, larger than `size_max`, or cannot be made."""
    try:
        cut = orjson.dumps(_cut(orjson.loads(body), CUT_ITEMS))
    except (orjson.JSONDecodeError, orjson.JSONEncodeError, RecursionError):
        return None
    if size_max is not None and len(cut) > size_max:
        return None
    try:
        model.model_validate_json(cut)
    except pydantic.ValidationError as errors:
        return errors
    return None


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
