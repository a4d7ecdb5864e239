"""Capture what real client libraries send to DeepSeek: `.venv/bin/python -m tests.corpus.capture [CLIENT…]`.

Runs every zoo client (tests/compat/zoo: thinking on and off, streaming and not, tool loops, handoffs,
structured output) straight against the fake DeepSeek and writes the chat bodies that arrive, one per line,
to tests/corpus/<client>.jsonl; the bodies the fake refuses (DeepSeek would: e.g. a thinking-mode tool turn
without its reasoning_content) go to tests/corpus/invalid/<client>.jsonl with the rule they break.

Each line is an OpenAI batch-input line (`chatgate lint` reads it as is) whose `body` is the request's own
bytes, spliced in unchanged: `{"custom_id": "<scenario>#<n>", "method": "POST", "url": …, "body": …}` (a
body of several lines is kept verbatim in `raw`).

Only the fake's random tool-call ids are renumbered (same length, per scenario), so that a re-run writes the
same files.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from chatgate.demo.deepseek import FakeState, RecordedRequest
from tests.compat.zoo.model import CLIENT_KEY, CLIENTS, REFUSALS, Scenario, renumber_call_ids, scenarios
from tests.compat.zoo.runner import Job, chat_requests, run_jobs
from tests.fakes.server import run_fake_deepseek

CORPUS = Path(__file__).resolve().parent
INVALID = CORPUS / "invalid"
BODY_MARK = ', "body": '


def corpus_line(meta: dict[str, Any], body: bytes) -> str:
    """A batch-input line whose `body` is the request's own bytes; a body of several lines (openai-node
    indents its JSON) is kept verbatim in `raw` and compacted into `body`."""
    parsed = json.loads(body)
    if b"\n" in body or b"\r" in body:
        meta = {**meta, "raw": body.decode()}
        body = json.dumps(parsed, ensure_ascii=False, separators=(",", ":")).encode()
    return json.dumps(meta, ensure_ascii=False)[:-1] + BODY_MARK + body.decode() + "}"


def split_line(line: bytes) -> tuple[dict[str, Any], bytes]:
    """(metadata, the request's own bytes) of a corpus line."""
    at = line.index(BODY_MARK.encode())
    meta: dict[str, Any] = json.loads(line[:at] + b"}")
    body = line[at + len(BODY_MARK):].rstrip(b"\r\n")
    if not body.endswith(b"}"):
        raise ValueError(f"{meta.get('custom_id')}: not a corpus line")
    return meta, meta["raw"].encode() if "raw" in meta else body[:-1]


def rule_of(record: RecordedRequest) -> str:
    """The rule (docs/rules-chat.md) of the fake's refusal (by DeepSeek's message); an unknown refusal is an
    error."""
    message = record.refused or ""
    for rule in REFUSALS.values():
        if rule.deepseek_message in message:
            return rule.rule
    raise RuntimeError(f"the fake refused a client's request for a reason unknown here: {message}")


def lines_of(scenario: Scenario, records: list[RecordedRequest]) -> Iterator[tuple[bool, str]]:
    """(valid, line) for each chat request of the scenario, in order."""
    ids: dict[bytes, bytes] = {}
    for n, record in enumerate(records, 1):
        meta: dict[str, Any] = {"custom_id": f"{scenario.id}#{n}", "method": "POST", "url": record.path,
                                "client": CLIENTS[scenario.client].library}
        body = renumber_call_ids(record.body, ids)
        if record.status == 200:
            yield True, corpus_line(meta, body)
            continue
        if record.status != 400:
            raise RuntimeError(f"{meta['custom_id']}: the fake answered {record.status}")
        rule = REFUSALS[rule_of(record)]
        meta["expect"] = {"rule": rule.rule, "code": rule.code, "param": rule.param(json.loads(body)),
                          "deepseek": record.refused}
        yield False, corpus_line(meta, body)


def capture(client: str, fake_url: str, fake: FakeState) -> tuple[list[str], list[str]]:
    """Run the client's scenarios against the fake at `fake_url`; (valid lines, invalid lines)."""
    mine = list(scenarios(client))
    fake.wait_idle(5)
    start = len(fake.requests)
    run_jobs(client, [Job(s, "corpus", fake_url + CLIENTS[client].route, CLIENT_KEY) for s in mine])
    fake.wait_idle(5)
    records = fake.requests[start:]
    valid: list[str] = []
    invalid: list[str] = []
    for scenario in mine:
        for ok, line in lines_of(scenario, chat_requests(records, scenario.id, CLIENT_KEY)):
            (valid if ok else invalid).append(line)
    return valid, invalid


def write(path: Path, lines: list[str]) -> None:
    if lines:
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    elif path.exists():
        path.unlink()


def main(argv: list[str]) -> int:
    warnings.filterwarnings("ignore", category=UserWarning)  # pydantic's notes on litellm's TypedDicts
    clients = argv or list(CLIENTS)
    unknown = set(clients) - set(CLIENTS)
    if unknown:
        print(f"unknown clients: {sorted(unknown)}; known: {', '.join(CLIENTS)}", file=sys.stderr)
        return 2
    INVALID.mkdir(exist_ok=True)
    with run_fake_deepseek() as fake:
        for client in clients:
            valid, invalid = capture(client, fake.url, fake.state)
            write(CORPUS / f"{client}.jsonl", valid)
            write(INVALID / f"{client}.jsonl", invalid)
            print(f"{client}: {len(valid)} valid, {len(invalid)} invalid bodies")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
