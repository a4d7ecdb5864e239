"""How a kept refusal is shown: its redacted body, indented, with each problem marked at its path; what
`chatgate lint --fix` would repair in it, and what the opt-in repairs would add, with the setting of each."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any, Protocol

import orjson

from chatgate.errors import Problem
from chatgate.profiles import ModelProfile
from chatgate.refusals.record import RefusalRecord
from chatgate.repair.base import NAMES, Applied, RepairOptions
from chatgate.verdict import Verdict

FIX_PASSES = 3  # as the gateway and lint: fixing a type can reveal a sequence problem
_STEP = re.compile(r"\.?([^.\[\]]+)|\[(\d+)\]")


class Checker(Protocol):
    """What the fix needs of an API family (chatgate.gateway.family.Family)."""

    def check(self, body: bytes, *, beta: bool, origin: str | None) -> Verdict: ...

    def repairable(self, found: Sequence[Problem], options: RepairOptions) -> bool: ...

    def repair(self, data: dict[str, Any], found: Sequence[Problem], options: RepairOptions,
               profile: ModelProfile | None, recalled: dict[int, str]) -> list[Applied]: ...


def path_of(param: str | None) -> tuple[str | int, ...]:
    """`messages[3].content[1]` as ("messages", 3, "content", 1)."""
    steps: list[str | int] = []
    for name, index in _STEP.findall(param or ""):
        steps.append(int(index) if index else name)
    return tuple(steps)


def marked(refusal: RefusalRecord) -> str:
    """The body as indented JSON, each problem's message after the line of the deepest part of its path
    the body has (`<-- R16 code: message`)."""
    try:
        data = orjson.loads(refusal.body)
    except orjson.JSONDecodeError:
        data = refusal.body
    marks: dict[tuple[str | int, ...], list[str]] = {}
    for p in refusal.problems:
        label = " ".join(str(x) for x in (p.get("rule"), p.get("code")) if x)
        marks.setdefault(_deepest(data, path_of(p.get("param"))), []).append(f"{label}: {p.get('message')}")
    lines: list[str] = []
    _render(data, (), 0, "", lines, marks, last=True)
    return "\n".join(lines)


def _deepest(data: Any, path: tuple[str | int, ...]) -> tuple[str | int, ...]:
    here = data
    for i, step in enumerate(path):
        if not _has(here, step):
            return path[:i]
        here = here[step]
    return path


def _has(here: Any, step: str | int) -> bool:
    if isinstance(step, int):
        return isinstance(here, list) and step < len(here)
    return isinstance(here, dict) and step in here


def _render(value: Any, path: tuple[str | int, ...], depth: int, prefix: str, lines: list[str],
            marks: dict[tuple[str | int, ...], list[str]], last: bool) -> None:
    pad = "  " * depth
    comma = "" if last else ","
    note = marks.get(path)
    tail = "   <-- " + " | ".join(note) if note else ""
    if isinstance(value, dict) and value:
        lines.append(f"{pad}{prefix}{{{tail}")
        items = list(value.items())
        for i, (k, v) in enumerate(items):
            key = orjson.dumps(k).decode() + ": "
            _render(v, (*path, k), depth + 1, key, lines, marks, i == len(items) - 1)
        lines.append(f"{pad}}}{comma}")
    elif isinstance(value, list) and value:
        lines.append(f"{pad}{prefix}[{tail}")
        for i, v in enumerate(value):
            _render(v, (*path, i), depth + 1, "", lines, marks, i == len(value) - 1)
        lines.append(f"{pad}]{comma}")
    else:
        lines.append(f"{pad}{prefix}{orjson.dumps(value).decode()}{comma}{tail}")


def would_fix(family: Checker, refusal: RefusalRecord, beta: bool, options: RepairOptions) -> dict[str, Any]:
    """What `chatgate lint --fix` would repair in the kept body with the repairs configured (redacted strings
    stay cut: a repair that depends on their text may differ on the original), and the problems left after;
    under `opt_in`, what the repairs that are off would add: each with the setting that turns it on, the
    problems left and the body repaired with them too (None when no repair that is off applies)."""
    try:
        data = orjson.loads(refusal.body)
    except orjson.JSONDecodeError:
        return {"repairs": [], "problems_left": [], "note": "the kept body is not JSON", "opt_in": None}
    now = _fix(family, data, beta, options)
    everything = dataclasses.replace(options, enabled=frozenset(NAMES))
    more = _fix(family, orjson.loads(refusal.body), beta, everything)
    added = [a for a in more["repairs"] if not options.on(a["code"])]
    now["opt_in"] = None if not added else {
        "repairs": [{**a, "setting": f"repair.{a['code']}", "env": f"CHATGATE_REPAIR_{a['code'].upper()}"}
                    for a in added],
        "problems_left": more["problems_left"], "fixed_body": more["fixed_body"]}
    return now


def _fix(family: Checker, data: Any, beta: bool, options: RepairOptions) -> dict[str, Any]:
    body = orjson.dumps(data)
    verdict = family.check(body, beta=beta, origin=None)
    applied: list[Applied] = []
    for _ in range(FIX_PASSES):
        found = [*verdict.problems, *verdict.warnings]
        if not isinstance(data, dict) or not family.repairable(found, options):
            break
        done = family.repair(data, found, options, verdict.profile, {})  # offline: nothing remembered
        if not done:
            break
        applied += done
        body = orjson.dumps(data)
        verdict = family.check(body, beta=beta, origin=None)
    return {"repairs": [a.as_dict() for a in applied],
            "problems_left": [p.as_dict() for p in verdict.problems],
            "fixed_body": orjson.loads(body) if applied else None}
