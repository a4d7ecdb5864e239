"""One refused request as kept by the inspector, and the redaction of its body."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

KEEP_CHARS = 32  # a long string keeps this many characters ...
LONG_CHARS = 64  # ... when it has more than this many
MAX_REFUSAL_CHARS = 64 * 1024  # one kept refusal, its body and problems (issue 48: one kept 71.6 MB)
MAX_PROBLEMS_CHARS = 16 * 1024  # of which its problems; beyond, the last are counted, not kept
MAX_MESSAGE_CHARS = 2000  # one problem's message
SOURCES = ("chatgate", "deepseek")
# a value a message quotes: '…', "…" or `…` (the rules quote the client's values so)
_LONG = "{" + str(LONG_CHARS + 1) + ",}"
_QUOTED = re.compile(f"'[^']{_LONG}'|\"[^\"]{_LONG}\"|`[^`]{_LONG}`")
_RUN = re.compile(f"\\S{_LONG}")  # a long value quoted some other way (or holding its quote)


@dataclass(frozen=True, slots=True)
class RefusalRecord:
    """A refused request: `source` says who refused it (chatgate's rules, or DeepSeek's answer)."""

    refusal_id: str
    request_id: str
    ts: float  # unix seconds (UTC) when the request arrived
    replica: str  # the process that kept it (each keeps its last N)
    key_id: str
    key_name: str
    team: str
    route: str
    model: str
    status: int
    source: str
    rules: tuple[str, ...]  # the rule codes (R16, A3, ...) or problem codes, in order, each once
    problems: list[dict[str, Any]]  # chatgate: its problems (code, param, message, rule); DeepSeek: [error]
    body: str  # the JSON body, redacted unless server.log_content
    redacted: bool

    def as_dict(self, *, with_body: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "refusal_id": self.refusal_id, "request_id": self.request_id, "ts": self.ts,
            "key_id": self.key_id, "key_name": self.key_name, "team": self.team, "route": self.route,
            "model": self.model, "status": self.status,
            "source": self.source, "rules": list(self.rules), "problems": self.problems,
            "redacted": self.redacted}
        if with_body:
            out["body"] = self.body
        return out


def redact(value: Any) -> Any:
    """Every string longer than LONG_CHARS cut to its first KEEP_CHARS characters and its length."""
    if isinstance(value, str):
        return f"{value[:KEEP_CHARS]}…[{len(value)} chars]" if len(value) > LONG_CHARS else value
    if isinstance(value, dict):
        return {redact(k): redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def redact_message(message: str) -> str:
    """A problem's message with each quoted value over LONG_CHARS cut as `redact` cuts a body's strings."""
    def cut(m: re.Match[str]) -> str:
        quote, value = m.group(0)[0], m.group(0)[1:-1]
        return f"{quote}{value[:KEEP_CHARS]}…[{len(value)} chars]{quote}"
    def cut_run(m: re.Match[str]) -> str:
        return f"{m.group(0)[:KEEP_CHARS]}…[{len(m.group(0))} chars]"
    return _RUN.sub(cut_run, _QUOTED.sub(cut, message))[:MAX_MESSAGE_CHARS]


def kept_problems(problems: list[dict[str, Any]], keep_content: bool) -> list[dict[str, Any]]:
    """The problems as kept: their messages redacted unless `keep_content` (as the body is), each message at
    most MAX_MESSAGE_CHARS, all of them at most MAX_PROBLEMS_CHARS (the rest counted in a last one)."""
    out: list[dict[str, Any]] = []
    size = 0
    for i, problem in enumerate(problems):
        message = str(problem.get("message") or "")
        kept = {k: (v[:MAX_MESSAGE_CHARS] if isinstance(v, str) else v) for k, v in problem.items()}
        kept["message"] = message[:MAX_MESSAGE_CHARS] if keep_content else redact_message(message)
        size += len(orjson.dumps(kept))
        if size > MAX_PROBLEMS_CHARS:
            out.append({"code": "problems_not_kept", "param": None, "rule": None,
                        "message": f"{len(problems) - i} more problem(s), not kept"})
            break
        out.append(kept)
    return out


def body_text(body: bytes, keep_content: bool, limit: int = MAX_REFUSAL_CHARS) -> tuple[str, bool]:
    """The body as kept: its JSON, redacted unless `keep_content`, at most `limit` characters; (text,
    redacted)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = body.decode("utf-8", "replace")  # not JSON: kept as one string
    try:
        text = orjson.dumps(data if keep_content else redact(data)).decode()
    except (RecursionError, orjson.JSONEncodeError):  # nested deeper than redact or orjson go (R1 refuses it)
        text = orjson.dumps(f"[a body nested too deep to keep: {len(body)} bytes]").decode()
    if len(text) > limit:
        text = orjson.dumps(text[:max(limit - 64, 0)] + f"…[{len(text)} chars in all]").decode()
    return text, not keep_content


def rules_of(problems: list[dict[str, Any]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(str(p.get("rule") or p.get("code") or "?") for p in problems))


def deepseek_problem(status: int, content: bytes) -> list[dict[str, Any]]:
    """DeepSeek's error answer as the refusal's one problem (its message, type, param and code)."""
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        return [{"code": str(error.get("code") or error.get("type") or status), "param": error.get("param"),
                 "message": str(error.get("message", ""))[:2000], "rule": None, "type": error.get("type")}]
    text = content[:2000].decode("utf-8", "replace")
    return [{"code": str(status), "param": None, "message": text, "rule": None}]
