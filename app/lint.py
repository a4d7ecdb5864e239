"""`chatgate lint`: the proxy's checks, offline, over JSON bodies, JSONL files and OpenAI batch-input files."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from app.errors import Problem
from app.validate import Policy, check_body


@dataclass(frozen=True, slots=True)
class Item:
    where: str  # file:line, and the batch custom_id when there is one
    body: bytes
    beta: bool = False
    read_error: str | None = None


def items_of(path: str, beta: bool) -> Iterator[Item]:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        yield Item(path, b"", beta, f"cannot read file: {exc.strerror}")
        return
    stripped = data.strip()
    if not stripped:
        yield Item(path, b"", beta, "empty file")
        return
    if b"\n" not in stripped or _is_one_document(stripped):
        yield _item(f"{path}", stripped, beta)
        return
    for n, line in enumerate(data.splitlines(), 1):
        if line.strip():
            yield _item(f"{path}:{n}", line, beta)


def _is_one_document(data: bytes) -> bool:
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return True


def _item(where: str, raw: bytes, beta: bool) -> Item:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return Item(where, raw, beta)  # check_body reports the JSON error
    if isinstance(doc, dict) and "body" in doc and "messages" not in doc:
        return _batch_line(where, doc, beta)
    return Item(where, raw, beta)


def _batch_line(where: str, doc: dict[str, Any], beta: bool) -> Item:
    label = f"{where} (custom_id {doc.get('custom_id')})" if "custom_id" in doc else where
    url = str(doc.get("url", ""))
    if url and not url.rstrip("/").endswith("chat/completions"):
        return Item(label, b"", beta, f"url {url!r} is not a chat-completions endpoint")
    return Item(label, orjson.dumps(doc["body"]), beta or "/beta/" in url)


def run_lint(files: list[str], policy: Policy, fmt: str = "text", beta: bool = False) -> int:
    results = []
    bad = 0
    for path in files:
        for item in items_of(path, beta):
            problems = _check(item, policy)
            bad += bool(problems)
            results.append({"where": item.where, "valid": not problems, "problems": [p.as_dict() for p in problems]})
    if fmt == "json":
        print(json.dumps({"checked": len(results), "invalid": bad, "results": results}))
    else:
        _print_text(results, bad)
    return 1 if bad else 0


def _check(item: Item, policy: Policy) -> list[Problem]:
    if item.read_error:
        return [Problem("unreadable", None, item.read_error)]
    return check_body(item.body, policy, beta=item.beta).problems


def _print_text(results: list[dict[str, Any]], bad: int) -> None:
    out = sys.stdout
    for r in results:
        if r["valid"]:
            continue
        for p in r["problems"]:
            rule = f" [{p['rule']}]" if p.get("rule") else ""
            out.write(f"{r['where']}: {p['param'] or '(body)'}: {p['code']}{rule}: {p['message']}\n")
    out.write(f"{len(results)} checked, {bad} invalid\n")
