"""Counts what a tree's rules make of the November corpus (november.jsonl): how many of its valid requests
they would refuse (false alarms) and how many of its invalid ones they catch, on default settings. Offline:
the families' `check_body` only, nothing forwarded. Imports `chatgate` from wherever Python finds it first, so
`PYTHONPATH=/path/to/other/tree python tests/corpus/november/measure.py` measures another tree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chatgate.anthropic.rules import check_body as check_messages
from chatgate.openai.rules import check_body as check_chat
from chatgate.responses.rules import check_body as check_responses
from chatgate.rules.models import Policy

CORPUS = Path(__file__).with_name("november.jsonl")


def problems(case: dict[str, Any]) -> list[str]:
    """The codes of the problems the rules refuse the case with (empty: forwarded)."""
    raw = json.dumps(case["body"], ensure_ascii=False).encode()
    path = case["path"]
    if path.startswith("/anthropic"):
        found = check_messages(raw, Policy()).problems
    elif path.endswith("/responses"):
        found = check_responses(raw, Policy()).problems
    else:
        found = check_chat(raw, Policy()).problems
    return [p.code for p in found]


def main() -> None:
    cases = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]
    valid = [c for c in cases if "refused" not in c]
    invalid = [c for c in cases if "refused" in c]
    false_alarms = [(c["name"], problems(c)) for c in valid if problems(c)]
    caught = [c["name"] for c in invalid if problems(c)]
    print(f"valid requests refused: {len(false_alarms)} of {len(valid)}")
    for name, codes in false_alarms:
        print(f"  {name}: {', '.join(codes)}")
    print(f"invalid requests caught: {len(caught)} of {len(invalid)}")
    for name in caught:
        print(f"  {name}")


if __name__ == "__main__":
    main()
