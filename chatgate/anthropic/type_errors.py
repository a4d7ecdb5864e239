"""Pydantic's type errors on a Messages request as problems: exact `param`, rule, how to fix (A1, A2, A9)."""

from __future__ import annotations

from typing import Any

import pydantic

from chatgate.errors import Problem
from chatgate.wire import json_type, param_of, problems_of, type_message

_RULES = {"model": "A1", "messages": "A1", "max_tokens": "A2", "temperature": "A20", "top_p": "A20",
          "thinking": "A11", "tool_choice": "A13", "output_config": "A14", "metadata": "A15", "tools": "A17",
          "safety_check": "A24"}
_TAGS = ("text", "blocks", "image", "thinking", "redacted_thinking", "tool_use", "tool_result", "other")


def problems_from_validation_error(exc: pydantic.ValidationError) -> list[Problem]:
    return problems_of(exc, _problem)


def _problem(error: Any) -> Problem:
    kind: str = error["type"]
    loc = tuple(error["loc"])
    if kind == "json_invalid":
        return Problem("invalid_json", None,
                       f"Request body is not valid JSON: {error['ctx']['error']}. Send a UTF-8 JSON object.",
                       "A1")
    if not loc:
        return Problem("invalid_json", None,
                       f"Request body must be a JSON object, got {json_type(error.get('input'))}.", "A1")
    path = [part for n, part in enumerate(loc)
            if not (isinstance(part, str) and part in _TAGS and n and loc[n - 1] != "type"
                    and isinstance(loc[n - 1], (int, str)) and (isinstance(loc[n - 1], int)
                                                                 or loc[n - 1] in ("content", "system")))]
    param = param_of(path)
    rule = _RULES.get(str(path[0]), "A1")
    if path[-1] == "thinking" and len(path) >= 4 and kind == "missing":
        return Problem("invalid_thinking_block", param,
                       f"{param.rsplit('.', 1)[0]}: missing field `thinking` (a thinking block needs its "
                       "'thinking' text; send \"\" if it was empty).", "A9")
    if kind == "missing":
        why = " (DeepSeek's Anthropic route requires it)" if param == "max_tokens" else ""
        return Problem("missing_required_parameter", param, f"Missing required parameter: '{param}'{why}.",
                       rule)
    if path[0] == "messages" and path[-1] == "content" and kind == "content_type":
        return Problem("invalid_type", param, f"{param} must be a string or an array of content blocks, got "
                       f"{json_type(error.get('input'))}.", "A1")
    return Problem("invalid_type", param, type_message(kind, error, param), rule)
