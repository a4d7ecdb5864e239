"""`chatgate lint`: the proxy's checks, offline, on JSON bodies, JSONL files and batch-input files (OpenAI's,
and Anthropic's `{"custom_id", "params"}` lines). Each body is checked by the family whose format it is in,
told apart by the batch line's `url` or by the body's fields: OpenAI chat completions (`messages`), FIM
completions (`prompt`, checked as on /beta), the Responses API (`input`), or Anthropic Messages (a top-level
`system`, Anthropic content blocks, a claude* model). `--fix` also applies the
configured repairs (those that need no memory of relayed answers) and writes the repaired bodies, in the
same form as the input, to stdout or `--output`; the repairs go to stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

import orjson

from chatgate.anthropic.family import MessagesFamily
from chatgate.errors import Problem
from chatgate.fim.family import FimFamily
from chatgate.gateway.family import Family
from chatgate.openai.chat import ChatFamily
from chatgate.repair.base import Applied, RepairOptions
from chatgate.responses.family import ResponsesFamily
from chatgate.rules.models import Policy
from chatgate.verdict import Verdict

Kind = Literal["chat", "fim", "responses", "messages"]

FIX_PASSES = 3  # as the gateway: fixing a type can reveal a sequence problem


@dataclass(slots=True)
class Item:
    file: str
    line: int | None  # 1-based line of the body (the first line of a single JSON document)
    body: bytes
    beta: bool = False
    read_error: str | None = None
    custom_id: str | None = None  # from an OpenAI batch-input line
    raw: bytes = b""  # the text as it was in the file (a line, or the whole document)
    batch: dict[str, Any] | None = None  # the batch-input line around the body
    batch_field: str = "body"  # where the body sits in it ("params" in Anthropic's batches)
    kind: Kind = "chat"  # the API family whose format the body is in
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    repairs: list[Applied] = field(default_factory=list)
    fixed: dict[str, Any] | None = None  # the repaired body

    @property
    def where(self) -> str:
        place = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{place} (custom_id {self.custom_id})" if self.custom_id is not None else place

    def output(self) -> bytes:
        """The item as it goes to the fixed file: unchanged unless repaired."""
        if self.fixed is None:
            return self.raw
        if self.batch is not None:
            return orjson.dumps({**self.batch, self.batch_field: self.fixed})
        return orjson.dumps(self.fixed)


@dataclass(slots=True)
class Source:
    path: str
    items: list[Item]


def read_source(path: str, beta: bool) -> Source:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return Source(path, [Item(path, None, b"", beta, f"cannot read file: {exc.strerror}")])
    data = data.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 BOM some editors add
    stripped = data.strip()
    if not stripped:
        return Source(path, [Item(path, None, b"", beta, "empty file")])
    if b"\n" not in stripped or _is_one_document(stripped):
        first = len(data[: data.index(stripped[:1])].splitlines()) + 1
        return Source(path, [_item(path, first, stripped, beta)])
    items = [_item(path, n, line.rstrip(b"\r"), beta) for n, line in enumerate(data.splitlines(), 1)
             if line.strip()]
    return Source(path, items)


def items_of(path: str, beta: bool) -> Iterator[Item]:
    yield from read_source(path, beta).items


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
        return Item(path, line, raw, beta, raw=raw)  # check_body reports the JSON error
    if isinstance(doc, dict) and "messages" not in doc and isinstance(doc.get("params"), dict):
        custom_id = str(doc["custom_id"]) if "custom_id" in doc else None
        return Item(path, line, orjson.dumps(doc["params"]), beta, None, custom_id, raw, doc, "params",
                    "messages")
    if isinstance(doc, dict) and "messages" not in doc and ("body" in doc or "custom_id" in doc):
        return _batch_line(path, line, doc, beta, raw)
    kind = kind_of(doc)
    return Item(path, line, raw, beta or kind == "fim", raw=raw, kind=kind)


def kind_of(doc: Any) -> Kind:
    """The family a lone body belongs to, from its fields (a chat body when nothing says otherwise)."""
    if looks_anthropic(doc):
        return "messages"
    if isinstance(doc, dict) and "messages" not in doc:
        if "input" in doc:
            return "responses"
        if "prompt" in doc:
            return "fim"
    return "chat"


ANTHROPIC_BLOCKS = ("tool_use", "tool_result", "thinking", "redacted_thinking", "image", "document")


def looks_anthropic(doc: Any) -> bool:
    """An Anthropic Messages body: a top-level `system`, Anthropic-only fields or content blocks, a claude*
    model. (A chat body puts its system prompt in `messages` and uses other block types.)"""
    if not isinstance(doc, dict):
        return False
    if "system" in doc or "stop_sequences" in doc or str(doc.get("model", "")).startswith("claude"):
        return True
    for msg in doc.get("messages") or ():
        content = msg.get("content") if isinstance(msg, dict) else None
        for block in content if isinstance(content, list) else ():
            if isinstance(block, dict) and block.get("type") in ANTHROPIC_BLOCKS:
                return True
    return False


def _batch_line(path: str, line: int, doc: dict[str, Any], beta: bool, raw: bytes) -> Item:
    custom_id = str(doc["custom_id"]) if "custom_id" in doc else None
    url = str(doc.get("url", ""))
    method = doc.get("method", "POST")
    kind = _kind_of_url(url.rstrip("/")) if url else kind_of(doc.get("body"))
    if kind is None:
        why = f"url {url!r} is not a chat-completions, completions, responses or messages endpoint"
        return Item(path, line, b"", beta, why, custom_id, raw)
    if str(method).upper() != "POST":
        return Item(path, line, b"", beta, f"method {method!r}: requests are POSTed", custom_id, raw)
    if not isinstance(doc.get("body"), dict):
        return Item(path, line, b"", beta, "batch line has no 'body' object (the request)", custom_id, raw)
    return Item(path, line, orjson.dumps(doc["body"]), beta or "/beta/" in url or kind == "fim", None,
                custom_id, raw, doc, kind=kind)


def _kind_of_url(url: str) -> Kind | None:
    if url.endswith("chat/completions"):
        return "chat"
    if url.endswith("/messages"):
        return "messages"
    if url.endswith("/responses"):
        return "responses"
    if url.endswith("/completions"):
        return "fim"
    return None


def families(policy: Policy) -> dict[Kind, Family]:
    """Each family by kind, checking with the same options as the server."""
    return {"chat": ChatFamily(policy), "fim": FimFamily(policy), "responses": ResponsesFamily(policy),
            "messages": MessagesFamily(policy)}


def check_item(item: Item, by_kind: dict[Kind, Family], repairs: RepairOptions | None = None) -> None:
    """Fill in the item's problems and warnings; with `repairs`, repair it first where that helps."""
    if item.read_error:
        item.problems = [Problem("unreadable" if not item.line else "invalid_batch_line", None,
                                 item.read_error)]
        return
    family = by_kind[item.kind]
    verdict = family.check(item.body, beta=item.beta, origin=None)
    if repairs is not None:
        verdict = _fix(item, family, verdict, repairs)
    item.problems, item.warnings = verdict.problems, verdict.warnings


def _fix(item: Item, family: Family, verdict: Verdict, repairs: RepairOptions) -> Verdict:
    for _ in range(FIX_PASSES):
        found = [*verdict.problems, *verdict.warnings]
        if not family.repairable(found, repairs):
            break
        try:
            data = orjson.loads(orjson.dumps(item.fixed) if item.fixed is not None else item.body)
        except orjson.JSONDecodeError:
            break
        if not isinstance(data, dict):
            break
        done = family.repair(data, found, repairs, verdict.profile, {})  # offline: nothing remembered
        if not done:
            break
        item.repairs += done
        item.fixed = data
        verdict = family.check(orjson.dumps(data), beta=item.beta, origin=None)
    return verdict


def run_lint(files: list[str], policy: Policy, fmt: str = "text", beta: bool = False,
             fix: RepairOptions | None = None, output: str | None = None) -> int:
    sources = [read_source(path, beta) for path in files]
    items = [item for source in sources for item in source.items]
    by_kind = families(policy)
    for item in items:
        check_item(item, by_kind, fix)
    bad = sum(bool(item.problems) for item in items)
    if fix is not None:
        _write_fixed(sources, output)
    report = sys.stderr if fix is not None and output is None else sys.stdout
    if fmt == "json":
        print(json.dumps(_json_report(items, bad, fix is not None)), file=report)
    else:
        _print_text(items, bad, fix is not None, report)
    return 1 if bad else 0


def _json_report(items: list[Item], bad: int, fixing: bool) -> dict[str, Any]:
    results = []
    for item in items:
        result: dict[str, Any] = {
            "where": item.where, "file": item.file, "line": item.line, "custom_id": item.custom_id,
            "valid": not item.problems, "problems": [p.as_dict() for p in item.problems],
            "warnings": [w.as_dict() for w in item.warnings]}
        if fixing:
            result["repairs"] = [a.as_dict() for a in item.repairs]
        results.append(result)
    report: dict[str, Any] = {"checked": len(items), "invalid": bad, "results": results}
    if fixing:
        report["repaired"] = sum(bool(item.repairs) for item in items)
    return report


def _print_text(items: list[Item], bad: int, fixing: bool, out: TextIO) -> None:
    for item in items:
        for a in item.repairs:
            out.write(f"{item.where}: repaired: {a.label()}{f' ({a.detail})' if a.detail else ''}\n")
        for kind, found in (("", item.problems), ("warning: ", item.warnings)):
            for p in found:
                rule = f" [{p.rule}]" if p.rule else ""
                out.write(f"{item.where}: {kind}{p.param or '(body)'}: {p.code}{rule}: {p.message}\n")
    repaired = f", {sum(bool(i.repairs) for i in items)} repaired" if fixing else ""
    after = " after repair" if fixing else ""
    out.write(f"{len(items)} checked{repaired}, {bad} invalid{after}\n")


def _write_fixed(sources: list[Source], output: str | None) -> None:
    """Each file in its own form (one document, or one line per item) to stdout, to `output` (one input
    file), or into the directory `output` under the input's name (several files)."""
    if output is not None and len(sources) > 1:
        Path(output).mkdir(parents=True, exist_ok=True)
    for source in sources:
        data = b"".join(item.output() + b"\n" for item in source.items if item.raw)
        if output is None:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
        elif len(sources) > 1:
            Path(output, Path(source.path).name).write_bytes(data)
        else:
            Path(output).write_bytes(data)
