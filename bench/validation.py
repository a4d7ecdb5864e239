"""Scenario 7: validation alone, in process: median time of `chatgate.openai.rules.check_body` (parse with
pydantic from bytes, then every rule) on a 1,000-message history with 200 tool-call pairs, under the
default policy, with the garbage-collector settings `chatgate serve` runs with (`chatgate.cli.tune_gc`).

Run alone: `.venv/bin/python -m bench.validation [--runs N]`.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import orjson

from bench.bodies import history_body
from bench.stats import median, percentile
from chatgate.cli import tune_gc
from chatgate.openai.rules import Checked, check_body
from chatgate.rules.models import Policy

BUDGET_MS = 2.0


def run(runs: int = 50) -> dict[str, Any]:
    body = orjson.dumps(history_body(1000, 200))
    result: dict[str, Any] = {"body_bytes": len(body), "messages": 1000, "tool_pairs": 200,
                              "api": "check_body(body, Policy())"}
    policy = Policy()
    tune_gc()

    def call(data: bytes) -> Checked:
        return check_body(data, policy)

    outcome = call(body)
    result["outcome"] = f"{len(outcome.problems)} problems: {outcome.problems[:2]!r}"[:300]
    result["valid"] = outcome.ok
    for _ in range(3):
        call(body)
    times: list[float] = []
    deadline = time.perf_counter() + 30.0
    for _ in range(runs):
        start = time.perf_counter()
        call(body)
        times.append(time.perf_counter() - start)
        if time.perf_counter() > deadline:
            break
    result.update(
        skipped=False,
        runs=len(times),
        median_ms=median(times) * 1000.0,
        p99_ms=percentile(times, 99) * 1000.0,
        json_loads_ms=_json_loads_ms(body),
    )
    return result


def _json_loads_ms(body: bytes) -> float:
    times = []
    for _ in range(20):
        start = time.perf_counter()
        json.loads(body)
        times.append(time.perf_counter() - start)
    return median(times) * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description="validation timing (scenario 7)")
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    print(json.dumps(run(args.runs), indent=2))


if __name__ == "__main__":
    main()
