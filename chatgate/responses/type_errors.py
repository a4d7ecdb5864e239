"""Pydantic's type errors on a Responses request as problems (P1): exact `param` (`input[3].output`), how to
fix, and DeepSeek's own words where they are known (`missing field `call_id``)."""

from __future__ import annotations

from typing import Any

import pydantic

from chatgate.errors import Problem
from chatgate.wire import EXPECTED, json_type, param_of, problems_of, type_message

_EXPECTED = {**EXPECTED, "input_type": "a string or an array of input items",
             "item_type": "an input item object", "part_type": "a content part object",
             "tool_type": "a tool object"}


def problems_from_validation_error(exc: pydantic.ValidationError) -> list[Problem]:
    return problems_of(exc, _problem, _EXPECTED)


_LABELS = ("str", "int", "float", "bool")


def _path(loc: tuple[Any, ...]) -> list[Any]:
    """Drop the union tags (`~items`, `~message`) and member labels (`str`, `list[…]`, `ToolChoice`)."""
    return [part for part in loc if not (isinstance(part, str) and (
        part.startswith("~") or "[" in part or part[:1].isupper() or part in _LABELS))]


def _problem(error: Any) -> Problem:
    kind: str = error["type"]
    if kind == "json_invalid":
        return Problem("invalid_json", None,
                       f"Request body is not valid JSON: {error['ctx']['error']}. Send a UTF-8 JSON object.",
                       "P1")
    path = _path(tuple(error["loc"]))
    if not path:
        return Problem("invalid_json", None,
                       f"Request body must be a JSON object, got {json_type(error.get('input'))}.", "P1")
    param = param_of(path)
    if kind == "missing":
        return Problem("missing_required_parameter", param, _missing(path, param), "P1")
    got = json_type(error.get("input"))
    if kind == "item_type":
        return Problem("invalid_type", param,
                       f"{param} must be an input item: an object with a 'type' (message, function_call, "
                       f"function_call_output, reasoning, …) or a message with a 'role'; got {got}.", "P1")
    if kind in ("part_type", "content_type", "input_type", "tool_type"):
        what = {"part_type": "a content part: an object with a 'type' (input_text, output_text, input_image)",
                "content_type": "a string or an array of content parts",
                "input_type": "a string or an array of input items",
                "tool_type": "a tool: an object with a 'type' (function, custom, web_search)"}[kind]
        return Problem("invalid_type", param, f"{param} must be {what}; got {got}.", "P1")
    if path[-1] == "output" and kind in ("string_type", "list_type"):
        return Problem("invalid_type", param,
                       f"Invalid type for '{param}': expected a string or an array of content parts, but got "
                       f"{got} instead.", "P1")
    if path[-1] == "arguments" and kind == "string_type":
        return Problem("invalid_type", param,
                       f"{param} must be a JSON string, got {got}. Serialise the arguments (json.dumps) as "
                       "DeepSeek returned them.", "P1")
    return Problem("invalid_type", param, type_message(kind, error, param), "P1")


def _missing(path: list[Any], param: str) -> str:
    field = path[-1]
    if path[0] == "tools" and field == "name" and len(path) == 3:
        return (f"Missing required parameter: '{param}'. Responses API function tools are flat: "
                "{\"type\": \"function\", \"name\": …, \"parameters\": {…}}, not chat's {\"function\": {…}}.")
    if path[0] == "input" and len(path) >= 3:
        where = param.rsplit(".", 1)[0]
        return f"{where}: missing field `{field}`. Send '{param}'."
    return f"Missing required parameter: '{param}'."
