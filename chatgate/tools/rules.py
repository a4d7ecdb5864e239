"""The tool APIs' rules T1-T8 (docs/rules-tools.md) as pure functions over a request body.

What DeepSeek documents as invalid is refused (search `query` 1-128 characters, `count` 1-50; fetch `url` at
most 8,192 characters; an OCR file at most 100 MiB; ASR audio at most 8 MiB); what it does not document (a
field's type, an unknown `purpose`, a body of another shape) is forwarded with a warning, refused in strict
mode. Unknown fields are forwarded: DeepSeek ignores them.

T1 JSON object · T2 search `query` · T3 search `count` · T4 fetch `url` · T5 an upload's file part ·
T6 OCR file size · T7 OCR `purpose` · T8 ASR audio size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from chatgate.errors import APIError, Problem
from chatgate.tools.multipart import Part, parts
from chatgate.wire import json_type

MiB = 1024 * 1024
QUERY_MAX = 128
COUNT_MAX = 50
URL_MAX = 8192
OCR_FILE_MAX = 100 * MiB
ASR_FILE_MAX = 8 * MiB
OCR_PURPOSES = ("text_recognition", "rich_layout_recognition")
# An upload's body is read whole (for its checks and its retries): its file at most, and this much for the
# other parts and the multipart framing.
UPLOAD_SLACK = MiB


def upload_too_large(tool: str, limit: int) -> APIError:
    """An upload over its route's most (its file's limit and UPLOAD_SLACK): the file is over the limit."""
    rule, most = ("T6", OCR_FILE_MAX) if tool == "ocr" else ("T8", ASR_FILE_MAX)
    return APIError(413, f"Request body is larger than {limit} bytes: the {tool.upper()} file must be at "
                    f"most {most // MiB} MiB ({rule}).", "invalid_request_error", "file", "file_too_large")


def upload_summary(body: bytes) -> bytes:
    """What the refusal inspector keeps of an upload: its parts' names, file names and sizes, as JSON."""
    found = parts(body)
    if found is None:
        return orjson.dumps({"upload": f"{len(body)} bytes, not multipart"})
    return orjson.dumps({"upload": [{"name": part.name, "filename": part.filename, "bytes": part.size}
                                    for part in found]})


def _warning(code: str, param: str | None, message: str, rule: str) -> Problem:
    return Problem(code, param, message, rule, warning=True)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def json_object(body: bytes) -> tuple[dict[str, Any] | None, list[Problem]]:
    """T1: the body as a JSON object."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return None, [Problem("invalid_json", None, f"Request body is not valid JSON: {exc}. Send a UTF-8 "
                              "JSON object.", "T1")]
    if not isinstance(data, dict):
        return None, [Problem("invalid_json", None, f"Request body must be a JSON object, got "
                              f"{json_type(data)}.", "T1")]
    return data, []


def check_search(data: dict[str, Any]) -> list[Problem]:
    found: list[Problem] = []
    query = data.get("query")
    if "query" not in data:
        found.append(Problem("missing_required_parameter", "query", "Failed to deserialize the JSON body "
                             "into the target type: missing field `query`. Send the search query, 1 to 128 "
                             "characters.", "T2"))
    elif not isinstance(query, str):
        found.append(_warning("invalid_type", "query", f"'query' should be a string, got {json_type(query)}; "
                              "DeepSeek's answer to this is not documented (forwarded).", "T2"))
    elif not 1 <= len(query) <= QUERY_MAX:
        found.append(Problem("invalid_query", "query", f"Invalid query length {len(query)}, the valid range "
                             f"of query length is [1, {QUERY_MAX}] characters. Shorten the query (operators "
                             "such as site: count too).", "T2"))
    count = data.get("count")
    if count is not None:
        if not _is_int(count):
            found.append(_warning("invalid_type", "count", f"'count' should be an integer, got "
                                  f"{json_type(count)}; DeepSeek's answer to this is not documented "
                                  "(forwarded).", "T3"))
        elif not 1 <= count <= COUNT_MAX:
            found.append(Problem("invalid_count", "count", f"Invalid count value {count}, the valid range of "
                                 f"count is [1, {COUNT_MAX}].", "T3"))
    return found


def check_fetch(data: dict[str, Any]) -> list[Problem]:
    url = data.get("url")
    if "url" not in data:
        return [Problem("missing_required_parameter", "url", "Failed to deserialize the JSON body into the "
                        "target type: missing field `url`. Send the one URL to read.", "T4")]
    if not isinstance(url, str):
        return [_warning("invalid_type", "url", f"'url' should be a string, got {json_type(url)}; DeepSeek's "
                         "answer to this is not documented (forwarded).", "T4")]
    if len(url) > URL_MAX:
        return [Problem("invalid_url", "url", f"Invalid url length {len(url)}, the url must be at most "
                        f"{URL_MAX} characters.", "T4")]
    return []


def _file_part(found: list[Part]) -> Part | None:
    named = [p for p in found if p.name == "file"]
    if named:
        return named[0]
    files = [p for p in found if p.filename is not None]
    return files[0] if files else None


def check_upload(body: bytes, limit: int, size_rule: str, what: str, required: bool
                 ) -> tuple[list[Part] | None, list[Problem]]:
    """T5 and the file's size (T6 OCR, T8 ASR): the multipart body's parts and what is wrong with them. A body
    that is not multipart is forwarded with a warning (`required`: DeepSeek documents the `file` part)."""
    found = parts(body)
    if found is None:
        return None, [_warning("not_multipart", None, f"The {what} body should be multipart/form-data with "
                               "a 'file' part; DeepSeek's answer to another shape is not documented "
                               "(forwarded).", "T5")]
    file = _file_part(found)
    if file is None:
        problem = Problem("missing_required_parameter", "file", f"The {what} request has no 'file' part: "
                          "upload the file as the multipart part named 'file'.", "T5")
        return found, [problem if required else _warning(problem.code, problem.param, problem.message, "T5")]
    if file.size > limit:
        return found, [Problem("file_too_large", "file", f"The {what} file is {file.size} bytes, larger than "
                               f"the {limit // MiB} MiB DeepSeek accepts.", size_rule)]
    return found, []


def check_ocr(body: bytes) -> list[Problem]:
    found, problems = check_upload(body, OCR_FILE_MAX, "T6", "OCR", required=True)
    purpose = next((p for p in found or () if p.name == "purpose"), None)
    if purpose is not None:
        value = body[purpose.start:purpose.end].decode("utf-8", "replace")
        if value not in OCR_PURPOSES:
            problems.append(_warning("unknown_purpose", "purpose", f"'purpose' {value[:64]!r} is not one of "
                                     f"{', '.join(OCR_PURPOSES)}; DeepSeek does not document refusing it "
                                     "(forwarded).", "T7"))
    return problems


def check_asr(body: bytes) -> list[Problem]:
    return check_upload(body, ASR_FILE_MAX, "T8", "ASR", required=False)[1]


def _json_route(rules: Callable[[dict[str, Any]], list[Problem]]) -> Callable[[bytes], list[Problem]]:
    def check(body: bytes) -> list[Problem]:
        data, problems = json_object(body)
        return problems if data is None else rules(data)
    return check


def _no_rules(data: dict[str, Any]) -> list[Problem]:
    return []


# Each tool's checks of a body (TTS: only T1, nothing of its body is documented)
CHECKS: dict[str, Callable[[bytes], list[Problem]]] = {
    "search": _json_route(check_search), "fetch": _json_route(check_fetch), "tts": _json_route(_no_rules),
    "ocr": check_ocr, "asr": check_asr,
}
# The multipart uploads: the most their body may hold
UPLOADS: dict[str, int] = {"ocr": OCR_FILE_MAX + UPLOAD_SLACK, "asr": ASR_FILE_MAX + UPLOAD_SLACK}
