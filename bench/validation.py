"""Scenario 7: validation alone, in process: median time of `app.validate.validate_request_bytes` on a
1,000-message history with 200 tool-call pairs. While that name is missing, `app.validate.check_body(body,
Policy())` (the API present today) is timed instead; skipped, with the reason, when neither exists.

Run alone: `.venv/bin/python -m bench.validation [--runs N]`.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import time
from collections.abc import Callable
from typing import Any

import orjson

from bench.bodies import history_body
from bench.stats import median, percentile

BUDGET_MS = 2.0


def _find_validator() -> tuple[Callable[..., Any] | None, str]:
    try:
        module = importlib.import_module("app.validate")
    except Exception as exc:  # any import failure: not there yet
        return None, f"app.validate not importable ({type(exc).__name__}: {exc})"
    func = getattr(module, "validate_request_bytes", None)
    if func is not None:
        return func, "validate_request_bytes"
    check_body = getattr(module, "check_body", None)
    policy_cls = getattr(module, "Policy", None)
    if check_body is not None and policy_cls is not None:
        policy = policy_cls()
        return (
            lambda body: check_body(body, policy)
        ), "check_body(body, Policy()) (no validate_request_bytes yet)"
    return None, "app.validate has neither validate_request_bytes nor check_body"


def _call_with_bytes(func: Callable[..., Any]) -> tuple[Callable[[bytes], Any] | None, str]:
    """Adapt to the signature: one required positional argument (the body) is what we support."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return (lambda body: func(body)), "signature unknown, called as f(body)"
    required = [
        p
        for p in sig.parameters.values()
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    required_kw = [
        p
        for p in sig.parameters.values()
        if p.default is inspect.Parameter.empty and p.kind is p.KEYWORD_ONLY
    ]
    if len(required) == 1 and not required_kw:
        return (lambda body: func(body)), f"{getattr(func, '__name__', 'f')}{sig}"
    return None, f"{getattr(func, '__name__', 'f')}{sig} needs more than the body; update bench/validation.py"


def run(runs: int = 50) -> dict[str, Any]:
    body = orjson.dumps(history_body(1000, 200))
    result: dict[str, Any] = {"body_bytes": len(body), "messages": 1000, "tool_pairs": 200}
    func, why = _find_validator()
    if func is None:
        result.update(skipped=True, note=why)
        return result
    call, sig_note = _call_with_bytes(func)
    result["api"] = why
    result["signature"] = sig_note
    if call is None:
        result.update(skipped=True, note=sig_note)
        return result
    try:
        outcome = call(body)
    except Exception as exc:  # report, do not crash the run
        result.update(skipped=True, note=f"validator raised {type(exc).__name__}: {exc}")
        return result
    problems = getattr(outcome, "problems", None)
    result["outcome"] = (
        f"{len(problems)} problems: {problems[:2]!r}"[:300] if problems is not None else repr(outcome)[:200]
    )
    result["valid"] = bool(getattr(outcome, "ok", not problems))
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
