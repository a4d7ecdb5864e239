"""The access log: one line per request on stdout, written in batches: a JSON line (`server.log_format =
"json"`, with its ISO time beside `ts`) or a line for people to read ("text"). The other log lines take the
same form (`log_formatter`).

Through the `logging` module a line cost about a tenth of a proxied request's CPU; here a line is one
`orjson.dumps` and a list append, and the lines of each 50 ms go out in one write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from typing import Any

import orjson

from chatgate.store.base import UsageRecord

FLUSH_SECONDS = 0.05


# the text form: these first, in this order, then the line's other fields as name=value
TEXT_FIRST = ("status", "outcome", "route", "model", "team", "key_id", "request_id")
TEXT_SKIPPED = frozenset({"event", "ts", *TEXT_FIRST})

_second: list[Any] = [None, ""]  # the last whole second formatted, and its text


def iso_time(ts: float) -> str:
    """`2026-12-07T17:52:44.123Z` (UTC, milliseconds); the seconds' part is formatted once per second."""
    whole = int(ts)
    if _second[0] != whole:
        _second[0], _second[1] = whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
    return f"{_second[1]}.{int((ts - whole) * 1000):03d}Z"


def text_line(line: dict[str, Any]) -> str:
    """An access-log line for people: time, status, outcome, route, model, team, key, request id, then the
    rest as name=value (strings with spaces, lists and objects as JSON), leaving out what is empty."""
    parts = [iso_time(line["ts"]) if isinstance(line.get("ts"), int | float) else "-"]
    parts += [str(line[name]) for name in TEXT_FIRST if line.get(name) is not None]
    for name, value in line.items():
        if name in TEXT_SKIPPED or value is None or value is False or value == [] or value == "":
            continue
        if isinstance(value, str) and value and not any(c.isspace() or c in "\"=" for c in value):
            parts.append(f"{name}={value}")
        else:
            parts.append(f"{name}={orjson.dumps(value).decode()}")
    return " ".join(parts)


class JsonLogFormatter(logging.Formatter):
    """A log record as a JSON line, in the access log's form: time, level, logger, message."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {"event": "log", "time": iso_time(record.created), "level": record.levelname,
                                "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line).decode()


class TextLogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = f"{iso_time(record.created)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def log_formatter(log_format: str) -> logging.Formatter:
    return TextLogFormatter() if log_format == "text" else JsonLogFormatter()


class AccessLog:
    def __init__(self, fd: int | None = None, log_format: str = "json") -> None:
        self._fd = fd if fd is not None else sys.stdout.fileno()
        self._lines: list[bytes] = []
        self._timer: asyncio.TimerHandle | None = None
        self._text = log_format == "text"

    def write(self, line: dict[str, Any]) -> None:
        if self._text:
            self._lines.append(text_line(line).encode("utf-8", "replace") + b"\n")
        else:
            ts = line.get("ts")
            stamped = ({"event": line.get("event", "request"), "time": iso_time(ts), **line}
                       if isinstance(ts, int | float) else line)
            self._lines.append(orjson.dumps(stamped, option=orjson.OPT_APPEND_NEWLINE))
        self._schedule()

    def _schedule(self) -> None:
        if self._timer is None:
            with contextlib.suppress(RuntimeError):  # no running loop: the next write schedules it
                self._timer = asyncio.get_running_loop().call_later(FLUSH_SECONDS, self.flush)

    def flush(self) -> None:
        self._timer = None
        data, self._lines = b"".join(self._lines), []
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._fd, view):]
            except BlockingIOError:  # a full pipe: keep the rest for the next flush, never spin
                self._lines.append(bytes(view))
                self._schedule()
                return
            except OSError:
                return  # stdout closed: the log is best effort, the request is not


def access_line(rec: UsageRecord, status: int) -> dict[str, Any]:
    line = {
        "event": "request", "ts": rec.ts, "request_id": rec.request_id, "key_id": rec.key_id,
        "team": rec.team, "model": rec.model, "route": rec.route, "stream": rec.stream, "status": status,
        "outcome": rec.outcome,
        "rule_code": rec.rule_code, "prompt_tokens": rec.prompt_tokens,
        "completion_tokens": rec.completion_tokens, "cache_hit_tokens": rec.prompt_cache_hit_tokens,
        "reasoning_tokens": rec.reasoning_tokens, "tokens_exact": rec.tokens_exact,
        "latency_ms": rec.latency_ms, "ttfb_ms": rec.ttfb_ms, "repairs": rec.repairs,
        "attempts": rec.attempts, "account": rec.account,
        **({"cache_break": rec.cache_break, "cache_lost_tokens": rec.cache_lost_tokens}
           if rec.cache_break is not None else {}),
    }
    if rec.unpriced:
        line["unpriced"] = True
    if rec.billed_unit is not None:  # a tool call, or a model's web searches and reads
        line.update(billed_units=rec.billed_units, billed_unit=rec.billed_unit,
                    billed_estimated=rec.billed_estimated, cost_picousd=rec.cost_picousd)
    return line
