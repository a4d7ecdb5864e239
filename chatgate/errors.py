"""The one error type chatgate produces, and its one rendering in the OpenAI shape."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import orjson

INVALID_REQUEST = "invalid_request_error"
MAX_PROBLEMS = 100  # listed in an error (a body can hold millions of bad items)


@dataclass(slots=True)  # not frozen: rules make them per request, and frozen costs a call per field
class Problem:
    """One thing wrong with a request: a stable rule `code`, the exact `param` path, a message saying how to
    fix it."""

    code: str
    param: str | None
    message: str
    rule: str | None = None  # the rule's number in docs/rules-*.md, e.g. "R16"
    warning: bool = False  # forwarded anyway, and said so (x-chatgate-warning, /validate's warnings)
    order: float | None = None  # where it sorts among the messages, when not at its param's index
    # a warning its caller cannot act on (a client's own habit): /metrics and a log line once per key and
    # hour (chatgate/gateway/notices.py), never x-chatgate-warning
    notice: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "param": self.param, "message": self.message, "rule": self.rule}


@dataclass(slots=True)
class APIError(Exception):
    """An error answered by chatgate itself (never forwarded from DeepSeek)."""

    status: int
    message: str
    type: str = INVALID_REQUEST
    param: str | None = None
    code: str | None = None
    problems: list[Problem] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    repairs: list[dict[str, Any]] = field(default_factory=list)  # what chatgate repaired before refusing

    def __reduce__(self) -> tuple[Any, ...]:  # raised in a checker process (chatgate/gateway/checking.py)
        return (type(self), (self.status, self.message, self.type, self.param, self.code, self.problems,
                             self.headers, self.repairs))

    def __str__(self) -> str:
        return self.message

    @classmethod
    def from_problems(cls, problems: list[Problem]) -> APIError:
        first = problems[0]
        message = first.message
        if len(problems) > MAX_PROBLEMS:
            message += (f" ({len(problems) - 1} more problem(s); the first {MAX_PROBLEMS} are listed in "
                        "error.problems)")
        elif len(problems) > 1:
            message += f" ({len(problems) - 1} more problem(s) listed in error.problems)"
        return cls(400, message, INVALID_REQUEST, first.param, first.code, problems[:MAX_PROBLEMS])

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {
            "message": self.message,
            "type": self.type,
            "param": self.param,
            "code": self.code,
        }
        if self.problems:
            error["problems"] = [p.as_dict() for p in self.problems]
        if self.repairs:
            error["repairs"] = self.repairs
        return {"error": error}

    def to_json(self) -> bytes:
        return orjson.dumps(self.body())


def not_found(path: str) -> APIError:
    return APIError(404, f"Unknown route: {path}. chatgate serves DeepSeek's routes: /v1/chat/completions, "
                    "/beta/completions (FIM), /v1/responses, /anthropic/v1/messages, /v1/models, "
                    "/user/balance, /v1/files (each also without /v1) and /anthropic/v1/files.",
                    "invalid_request_error", None, "not_found")


def unauthorized(message: str) -> APIError:
    return APIError(401, message, "authentication_error", None, "invalid_api_key",
                    headers={"www-authenticate": "Bearer"})


def bad_gateway(message: str, code: str = "upstream_unreachable") -> APIError:
    return APIError(502, message, "upstream_error", None, code)


def upstream_auth_failed(request_id: str | None) -> APIError:
    """Managed mode: DeepSeek refused chatgate's own upstream key (401), logged for the operator. The client's
    key is fine, and DeepSeek's text names the last four characters of chatgate's key: neither goes to the
    client."""
    logging.getLogger("chatgate").error(
        "DeepSeek refused the upstream API key with 401 (request %s): check DEEPSEEK_API_KEY / "
        "upstream.accounts", request_id)
    return APIError(502, "DeepSeek refused chatgate's upstream API key (401): the operator must check "
                    "DEEPSEEK_API_KEY / upstream.accounts. Your chatgate key is fine.", "upstream_error",
                    None, "upstream_auth_failed")


def gateway_timeout(message: str) -> APIError:
    return APIError(504, message, "upstream_error", None, "upstream_timeout")


NOT_OWNED = "file_not_owned"  # the code for a file of another team (or of no team) in managed mode


def no_such_file(file_id: str, param: str | None = None) -> APIError:
    """DeepSeek's answer to an unknown file id, in its shape: a file of another team is indistinguishable
    from one that does not exist."""
    return APIError(404, f"No such file: {file_id}", "not_found_error", param, "invalid_request_error")


MODEL_MAX_CHARS = 256  # chatgate's own bound on the `model` it stores and logs (issue 48), not DeepSeek's


def model_too_long(length: int) -> APIError:
    return APIError(400, f"'model' is {length} characters long; chatgate accepts model names of at most "
                    f"{MODEL_MAX_CHARS} characters (DeepSeek's are a few dozen).", INVALID_REQUEST, "model",
                    "model_too_long")


def store_unavailable() -> APIError:
    return APIError(503, "chatgate cannot reach its store to check who owns the file; retry later.",
                    "server_error", None, "store_unavailable", headers={"retry-after": "5"})
