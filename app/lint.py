"""`chatgate lint`: the proxy's checks, offline, on JSON bodies, JSONL files and OpenAI batch-input files."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from app.errors import Problem
from app.openai.rules import Policy, check_body


@dataclass(frozen=True, slots=True)
class Item:
    file: str
    line: int | None  # 1-based line of the body (the first line of a single JSON document)
    body: bytes
    beta: bool = False
    read_error: str | None = None
    custom_id: str | None = None  # from an OpenAI batch-input line

    @property
    def where(self) -> str:
        place = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{place} (custom_id {self.custom_id})" if self.custom_id is not None else place


def items_of(path: str, beta: bool) -> Iterator[Item]:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        yield Item(path, None, b"", beta, f"cannot read file: {exc.strerror}")
        return
    data = data.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 BOM some editors add
    stripped = data.strip()
    if not stripped:
        yield Item(path, None, b"", beta, "empty file")
        return
    if b"\n" not in stripped or _is_one_document(stripped):
        first = len(data[: data.index(stripped[:1])].splitlines()) + 1
        yield _item(path, first, stripped, beta)
        return
    for n, line in enumerate(data.splitlines(), 1):
        if line.strip():
            yield _item(path, n, line, beta)


def _is_one_document(data: bytes) -> bool:
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return True


def _item(path: str, line: int, raw: bytes, beta: bool) -> Item:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return Item(path, line, raw, beta)  # check_body reports the JSON error
    if isinstance(doc, dict) and "messages" not in doc and ("body" in doc or "custom_id" in doc):
        return _batch_line(path, line, doc, beta)
    return Item(path, line, raw, beta)


def _batch_line(path: str, line: int, doc: dict[str, Any], beta: bool) -> Item:
    custom_id = str(doc["custom_id"]) if "custom_id" in doc else None
    url = str(doc.get("url", ""))
    method = doc.get("method", "POST")
    if url and not url.rstrip("/").endswith("chat/completions"):
        return Item(path, line, b"", beta, f"url {url!r} is not a chat-completions endpoint", custom_id)
    if str(method).upper() != "POST":
        return Item(path, line, b"", beta, f"method {method!r}: chat completions are POSTed", custom_id)
    if not isinstance(doc.get("body"), dict):
        return Item(path, line, b"", beta, "batch line has no 'body' object (the chat-completions request)",
                    custom_id)
    return Item(path, line, orjson.dumps(doc["body"]), beta or "/beta/" in url, None, custom_id)


def run_lint(files: list[str], policy: Policy, fmt: str = "text", beta: bool = False) -> int:
    results = []
    bad = 0
    for path in files:
        for item in items_of(path, beta):
            problems, warnings = _check(item, policy)
            bad += bool(problems)
            results.append({"where": item.where, "file": item.file, "line": item.line,
                            "custom_id": item.custom_id, "valid": not problems,
                            "problems": [p.as_dict() for p in problems],
                            "warnings": [w.as_dict() for w in warnings]})
    if fmt == "json":
        print(json.dumps({"checked": len(results), "invalid": bad, "results": results}))
    else:
        _print_text(results, bad)
    return 1 if bad else 0


def _check(item: Item, policy: Policy) -> tuple[list[Problem], list[Problem]]:
    if item.read_error:
        return [Problem("unreadable" if not item.line else "invalid_batch_line", None, item.read_error)], []
    checked = check_body(item.body, policy, beta=item.beta)
    return checked.problems, checked.warnings


def _print_text(results: list[dict[str, Any]], bad: int) -> None:
    out = sys.stdout
    for r in results:
        for kind, found in (("", r["problems"]), ("warning: ", r["warnings"])):
            for p in found:
                rule = f" [{p['rule']}]" if p.get("rule") else ""
                param = p["param"] or "(body)"
                out.write(f"{r['where']}: {kind}{param}: {p['code']}{rule}: {p['message']}\n")
    out.write(f"{len(results)} checked, {bad} invalid\n")
