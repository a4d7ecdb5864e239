"""Turn pydantic's type errors into chatgate problems: exact `param` path, rule code, how to fix."""

from __future__ import annotations

from typing import Any

import pydantic

from chatgate.errors import Problem
from chatgate.openai.protocol import ROLES
from chatgate.wire import json_type, param_of, problems_of, type_message

_PART_TAGS = ("text", "image_url", "file")
_CONTENT_TAGS = ("text", "parts")

_PARAM_RULES = {
    "model": "R2", "messages": "R4", "temperature": "R25", "top_p": "R25", "frequency_penalty": "R26",
    "presence_penalty": "R26", "max_tokens": "R27", "stop": "R28", "stream": "R29", "stream_options": "R29",
    "tools": "R30", "tool_choice": "R33", "logprobs": "R35", "top_logprobs": "R35", "thinking": "R36",
    "reasoning_effort": "R36", "user_id": "R37", "n": "R38", "response_format": "R23", "safety_check": "R42",
}


def problems_from_validation_error(exc: pydantic.ValidationError, body: bytes) -> list[Problem]:
    return problems_of(exc, _problem)


def _problem(error: Any) -> Problem:
    kind: str = error["type"]
    loc: tuple[Any, ...] = tuple(error["loc"])
    if kind == "json_invalid":
        return Problem("invalid_json", None,
                       f"Request body is not valid JSON: {error['ctx']['error']}. Send a UTF-8 JSON object.",
                       "R1")
    if not loc:
        return Problem("invalid_json", None,
                       f"Request body must be a JSON object, got {json_type(error.get('input'))}.", "R1")
    path, role = _path(loc)
    param = param_of(path)
    if path[0] == "messages" and len(path) >= 2:
        return _message_problem(kind, error, path, param, role)
    rule = _PARAM_RULES.get(str(path[0]))
    if kind == "missing":
        return Problem("missing_required_parameter", param, f"Missing required parameter: '{param}'.", rule)
    return Problem("invalid_type", param, type_message(kind, error, param), rule)


def _path(loc: tuple[Any, ...]) -> tuple[list[Any], str | None]:
    """Drop pydantic's union tags from a location.

    ('messages', 3, 'tool', 'content') -> messages[3].content
    """
    path: list[Any] = []
    role: str | None = None
    for n, part in enumerate(loc):
        prev = loc[n - 1] if n else None
        if isinstance(prev, int) and len(path) == 2 and path[0] == "messages" and part in ROLES:
            role = part
            continue
        if prev == "content" and part in _CONTENT_TAGS:
            continue
        if isinstance(prev, int) and len(path) >= 2 and path[-2] == "content" and part in _PART_TAGS:
            continue
        if isinstance(part, str) and ("[" in part or part[:1].isupper() or part[:1] == "~"
                                      or part in ("str", "int")):
            continue  # a union member label such as 'list[str]' or 'ToolChoiceFunction'
        path.append(part)
    return path, role


def _message_problem(kind: str, error: Any, path: list[Any], param: str, role: str | None) -> Problem:
    i = path[1]
    who = f"messages[{i}]" + (f" (role {role})" if role else "")
    field = path[2] if len(path) > 2 else None
    if len(path) == 2:
        return _message_itself(kind, error, i, param)
    if field == "tool_calls":
        return _tool_call_problem(kind, error, path, param, who)
    if kind == "missing" and field == "content" and len(path) > 3:
        return Problem("invalid_content_part", param,
                       f"{who}: missing required parameter '{param}'. Content parts are "
                       "{type: text, text}, {type: image_url, image_url: {url}} or "
                       "{type: file, file: {file_id | file_data}}.",
                       "R7")
    if kind == "missing":
        code = "missing_tool_call_id" if field == "tool_call_id" else "missing_required_parameter"
        rule = "R13" if field == "tool_call_id" else ("R5" if field == "role" else "R6")
        return Problem(code, param, f"Missing required parameter: '{param}' ({who}).", rule)
    if field == "content" and kind == "union_tag_not_found":
        return Problem("invalid_content_part", f"{param}.type",
                       f"{who}: content part {param.split('.')[-1]} has no 'type'; use "
                       "{type: text, text}, {type: image_url, image_url: {url}} or "
                       "{type: file, file: {...}}.",
                       "R7")
    if field == "content" and kind == "union_tag_invalid":
        return Problem("invalid_content_part", f"{param}.type",
                       f"{who}: content part type '{error['ctx']['tag']}' is not supported; use text, "
                       "image_url or file.", "R7")
    if field == "content" and len(path) > 3:
        return Problem("invalid_content_part", param, f"{who}: {type_message(kind, error, param)} Content "
                       "parts are {type: text, text}, {type: image_url, image_url: {url}} or "
                       "{type: file, file: {file_id | file_data}}.", "R7")
    if field == "content":
        got = json_type(error.get("input"))
        expected = "a string" if role in ("system", "assistant") else "a string or an array of content parts"
        return Problem("content_not_string", param,
                       f"{who}: content must be {expected}, got {got}."
                       + (" Join text parts into one string." if got == "array"
                          else " Send the text as a JSON string" + (" (or null beside tool_calls)."
                                                                     if role == "assistant" else ".")),
                       "R6")
    other_rule = {"tool_call_id": "R13", "prefix": "R21", "role": "R5"}.get(str(field))
    return Problem("invalid_type", param, f"{who}: {type_message(kind, error, param)}", other_rule)


def _message_itself(kind: str, error: Any, i: int, param: str) -> Problem:
    if kind == "union_tag_invalid":
        tag = error["ctx"]["tag"]
        fix = "use 'system'" if tag == "developer" else "use one of system, user, assistant, tool"
        return Problem("invalid_role", f"{param}.role",
                       f"messages[{i}].role '{tag}' is not supported by DeepSeek; {fix}.", "R5")
    if kind == "union_tag_not_found":
        return Problem("missing_required_parameter", f"{param}.role",
                       f"Missing required parameter: '{param}.role'. Each message needs a role: "
                       "system, user, assistant or tool.", "R5")
    return Problem("invalid_type", param,
                   f"messages[{i}] must be an object with 'role' and 'content', got "
                   f"{json_type(error.get('input'))}.", "R4")


def _tool_call_problem(kind: str, error: Any, path: list[Any], param: str, who: str) -> Problem:
    if path[-1] == "arguments" and kind == "string_type":
        got = json_type(error.get("input"))
        return Problem("invalid_tool_call", param,
                       f"{who}: {param.split('.', 1)[1]} must be a JSON string, got {got}. Serialise it "
                       "(json.dumps(arguments)) as DeepSeek returned it.", "R11")
    if kind == "missing":
        return Problem("invalid_tool_call", param, f"Missing required parameter: '{param}' ({who}).", "R11")
    return Problem("invalid_tool_call", param, f"{who}: {type_message(kind, error, param)}", "R11")
