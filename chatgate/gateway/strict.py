"""R1 as DeepSeek's serde front-end reads a body, beyond what the families' validators read: a body it refuses
is refused here too, so that what chatgate checked (limits, file owners, rules) is what DeepSeek would read.

- duplicate keys (`"max_tokens": 99999999, "max_tokens": 10`): pydantic and orjson keep the last, serde's
  derived structs refuse them; chatgate refuses them all (no client library writes them).
- NaN, Infinity, and numbers beyond a double (`1e400`): not JSON; orjson, and so every later look at the
  body (the file-owner check among them), cannot read them.
- containers nested deeper than 128 (serde_json's recursion limit), a NUL in `model`.

Cost on a plain request: one Rust parse that reports duplicates (jiter), whose result the family's check
then validates (`parse_strictly` returns it; chatgate/wire.py `validate_body`), and one pass over the bytes (a
translate, a count, two searches); orjson's parse and the depth walk run only when those cannot rule their
case out.
"""

from __future__ import annotations

from typing import Any

import jiter
import orjson

from chatgate.errors import Problem

MAX_DEPTH = 128  # serde_json's recursion limit: objects and arrays
# An integer part this long may overflow a double with a one- or two-digit exponent (10^209 * 10^99 cannot);
# an exponent of three digits or more may overflow whatever the mantissa.
OVERFLOW_DIGITS = 210
# One pass over the body for both byte checks: digits to "0", "E" to "e", "{" to "[", "+" dropped. A number
# that may overflow a double then shows as "0e000" (an exponent of three digits or more) or a run of
# OVERFLOW_DIGITS zeros; "[" counts every container's opening (with any in strings: an upper bound).
_SCAN = bytes.maketrans(b"123456789E{", b"000000000e[")
_LONG_NUMBER = b"0" * OVERFLOW_DIGITS


def body_problem(body: bytes) -> Problem | None:
    """Why DeepSeek would refuse this body as JSON, when the families' checks would not say so; None if it
    reads it as chatgate does (a body that is not JSON at all is left to the family's check and its words)."""
    return parse_strictly(body)[1]


def parse_strictly(body: bytes) -> tuple[Any, Problem | None]:
    """The body's parse (None if it is not JSON) and `body_problem`'s answer, from one parse."""
    try:
        data = jiter.from_json(body, allow_inf_nan=False, catch_duplicate_keys=True, cache_mode="keys")
    except ValueError as exc:
        return None, _not_json(str(exc), body)
    scan = body.translate(_SCAN, b"+")
    # A number may overflow a double: orjson says whether one does. (rfind, not `in`: CPython's backward
    # search is the faster one on such bytes.)
    if scan.rfind(b"0e000") >= 0 or scan.rfind(_LONG_NUMBER) >= 0:
        try:
            orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return data, _unreadable(str(exc))
    # the "["s counted by what dropping them removes (found by memchr: faster than bytes.count)
    if len(scan) - len(scan.replace(b"[", b"")) > MAX_DEPTH and too_deep(data):
        return data, _too_deep()
    if isinstance(data, dict) and isinstance(model := data.get("model"), str) and "\x00" in model:
        return data, Problem("invalid_model", "model", "'model' contains a NUL character (\\u0000), which "
                             "DeepSeek refuses; send the model's name.", "R1")
    return data, None


def _not_json(message: str, body: bytes) -> Problem | None:
    if message.startswith("recursion limit exceeded"):  # jiter's own limit (200) is beyond DeepSeek's
        return _too_deep()
    if message.startswith("Detected duplicate key"):
        key = message.split('"')[1] if message.count('"') >= 2 else "?"
        return Problem("duplicate_key", None,
                       f"Request body is not valid JSON for DeepSeek: {message}. A key may appear once per "
                       f"object; send '{key}' once.", "R1")
    try:  # what orjson reads too is left to the family's check (it says where the JSON breaks)
        orjson.loads(body)
    except orjson.JSONDecodeError:
        if b"NaN" not in body and b"Infinity" not in body:
            return None
    except RecursionError:
        pass
    return _unreadable(message)


def _too_deep() -> Problem:
    return Problem("nesting_too_deep", None,
                   f"Request body nests arrays or objects deeper than {MAX_DEPTH} levels, which DeepSeek "
                   "refuses (recursion limit exceeded).", "R1")


def _unreadable(message: str) -> Problem:
    return Problem("invalid_json", None,
                   f"Request body is not valid JSON: {message}. JSON has no NaN or Infinity, and DeepSeek "
                   "refuses numbers beyond a double (such as 1e400); send finite numbers.", "R1")


def too_deep(data: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether arrays and objects nest deeper than `limit` (a top-level object is level 1), level by level."""
    level = [data] if isinstance(data, (dict, list)) else []
    for _ in range(limit):
        if not level:
            return False
        level = [child for node in level for child in (node.values() if isinstance(node, dict) else node)
                 if isinstance(child, (dict, list))]
    return bool(level)
