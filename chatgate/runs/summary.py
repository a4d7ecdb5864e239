"""A run as its requests add up: the document `chatgate runs`, GET /admin/runs and the dashboard show, and
one run round by round (`chatgate runs show`). Pure functions of the store's rows."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from chatgate.metering import text
from chatgate.runs import reading
from chatgate.store.runs import RUN_LIMIT, RunHead, RunRecord, RunStore

IDLE_SECONDS = 600.0  # a run with no request for this long has ended
PICO = Decimal(10) ** 12


def _money(pico: int) -> float:
    return float(Decimal(pico) / PICO)


def _ended(head: RunHead, last: RunRecord | None, now: float) -> str:
    """finished, stopped (by a bound), abandoned (its last request failed and none came since), or active."""
    if head.stopped is not None and last is not None and (last.rule_code or "").startswith(RUN_LIMIT):
        return "stopped"
    if last is None or now - last.ts < IDLE_SECONDS:
        return "active"
    return "finished" if last.outcome == "ok" else "abandoned"


def summarize(head: RunHead, requests: Sequence[RunRecord], now: float | None = None) -> dict[str, Any]:
    """One run's line: who, when, how many requests and rounds, its tokens and cost, its largest context."""
    now = time.time() if now is None else now
    tools: Counter[str] = Counter()
    for r in requests:
        if not r.retry:
            tools.update(r.tool_calls)
    last = requests[-1] if requests else None
    widest = max(requests, key=lambda r: r.prompt_tokens, default=None)
    window = widest.context_window if widest is not None else 0
    context = widest.prompt_tokens if widest is not None else 0
    currency = last.currency if last is not None else "USD"
    finish = next((r.finish for r in reversed(requests) if r.finish is not None), None)
    return {
        "run_id": head.run_id, "key_id": head.key_id, "key_name": head.key_name, "team": head.team,
        "source": head.source, "started": head.started, "last_seen": last.ts if last else head.started,
        "requests": len(requests), "request_ids": [r.request_id for r in requests],
        "rounds": sum(1 for r in requests if r.outcome == "ok" and not r.retry),
        "tool_calls": dict(sorted(tools.items())),
        "prompt_tokens": sum(r.prompt_tokens for r in requests),
        "prompt_cache_hit_tokens": sum(r.prompt_cache_hit_tokens for r in requests),
        "prompt_cache_miss_tokens": sum(r.prompt_cache_miss_tokens for r in requests),
        "completion_tokens": sum(r.completion_tokens for r in requests),
        "reasoning_tokens": sum(r.reasoning_tokens for r in requests),
        f"cost_{currency.lower()}": _money(sum(r.cost_picousd for r in requests)), "currency": currency,
        "max_context_tokens": context, "context_window": window,
        "context_share": round(context / window, 4) if window else None,
        "repairs": sum(r.repairs for r in requests),
        "refusals": sum(1 for r in requests if r.outcome in ("rejected", "limited")),
        "retries": sum(r.attempts - 1 for r in requests) + sum(1 for r in requests if r.retry),
        "last_finish_reason": finish, "ended": _ended(head, last, now), "stopped_by": head.stopped,
    }


def rounds(requests: Sequence[RunRecord]) -> list[dict[str, Any]]:
    """The run request by request: its tokens, cost, the tools its answer called, the context it sent and
    how much that grew since the request before."""
    out: list[dict[str, Any]] = []
    before = 0
    answered = [r for r in requests if not r.retry]
    # a request carries back the answer of the one before it: its tool calls and finish are that round's
    carried = {a.request_id: (b.tool_calls, b.finish) for a, b in itertools.pairwise(answered)}
    for n, r in enumerate(requests, 1):
        tool_calls, finish = carried.get(r.request_id, ({}, None))
        out.append({
            "n": n, "request_id": r.request_id, "ts": r.ts, "model": r.model, "outcome": r.outcome,
            "status": r.status, "rule_code": r.rule_code, "retry": r.retry,
            "prompt_tokens": r.prompt_tokens, "prompt_cache_hit_tokens": r.prompt_cache_hit_tokens,
            "completion_tokens": r.completion_tokens, "reasoning_tokens": r.reasoning_tokens,
            f"cost_{r.currency.lower()}": _money(r.cost_picousd),
            "tool_calls": dict(tool_calls), "finish_reason": finish,
            "context_tokens": r.prompt_tokens, "context_growth": r.prompt_tokens - before if r.prompt_tokens
            else 0, "context_window": r.context_window,
        })
        if r.prompt_tokens:
            before = r.prompt_tokens
    return out


def runs_document(heads: Sequence[RunHead], now: float | None = None) -> dict[str, Any]:
    """`{"runs": [...]}`, each run with its context per request (`context`: the chart's points)."""
    runs = []
    for head in heads:
        requests = head.requests_read
        line = summarize(head, requests, now)
        line["context"] = [r.prompt_tokens for r in requests if r.outcome == "ok"]
        runs.append(line)
    return {"object": "list", "runs": runs}


def show(store: RunStore, run_id: str) -> dict[str, Any] | None:
    """`chatgate runs show RUN`'s document: the run's line and its requests (`rounds`)."""
    head = reading.one(store, run_id)
    if head is None:
        return None
    return {"run": summarize(head, head.requests_read), "rounds": rounds(head.requests_read)}


# --- text, for the CLI --------------------------------------------------------------------------------------


def _cost_of(line: dict[str, Any]) -> str:
    currency = str(line.get("currency", "USD"))
    value = line.get(f"cost_{currency.lower()}", 0.0)
    return f"{'¥' if currency == 'CNY' else '$'}{value:.4f}" if value >= 0.01 or not value else \
        f"{'¥' if currency == 'CNY' else '$'}{value:.6f}"


def _tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 10_000 else str(n)


def table(document: dict[str, Any], lang: str = "en") -> str:
    """The runs, one line each, at most 120 columns; the heads in `lang`."""
    head = ("run", "team", "key", "reqs", "rounds", "prompt", "compl", "cost", "context", "ended")
    rows = [head]
    for r in document["runs"]:
        share = r["context_share"]
        context = _tokens(r["max_context_tokens"]) + (f" {share:.0%}" if share is not None else "")
        rows.append((r["run_id"][:36], r["team"][:12], r["key_id"][:16], str(r["requests"]), str(r["rounds"]),
                     _tokens(r["prompt_tokens"]), _tokens(r["completion_tokens"]), _cost_of(r), context,
                     r["ended"] if r["stopped_by"] is None else f"stopped: {r['stopped_by']}"))
    return "".join(line + "\n" for line in text.lines(rows, lang))


def show_text(line: dict[str, Any], steps: list[dict[str, Any]]) -> str:
    """One run: its totals, then request by request with a bar of the context it sent."""
    out = [f"run {line['run_id']}  ({line['source']}; team {line['team']}, key {line['key_id']})",
           f"  {line['requests']} requests, {line['rounds']} rounds, {line['retries']} retries, "
           f"{line['refusals']} refused, {line['repairs']} repairs; ended: {line['ended']}"
           + (f" (stopped by {line['stopped_by']})" if line["stopped_by"] else ""),
           f"  tokens: prompt {line['prompt_tokens']} (cache hit {line['prompt_cache_hit_tokens']}, miss "
           f"{line['prompt_cache_miss_tokens']}), completion {line['completion_tokens']} (reasoning "
           f"{line['reasoning_tokens']}); cost {_cost_of(line)}",
           f"  largest context: {line['max_context_tokens']} tokens"
           + (f" ({line['context_share']:.1%} of {line['context_window']})" if line["context_share"] else ""),
           "  tools called: " + (", ".join(f"{k} x{v}" for k, v in line["tool_calls"].items()) or "none"), ""]
    widest = max((s["context_tokens"] for s in steps), default=0) or 1
    out.append("   #  outcome   context  growth  compl  cost       tools                 context")
    for s in steps:
        bar = "█" * max(1 if s["context_tokens"] else 0, round(30 * s["context_tokens"] / widest))
        tools = ",".join(f"{k} x{v}" if v > 1 else k for k, v in s["tool_calls"].items()) or "-"
        outcome = s["outcome"] if s["rule_code"] is None else f"{s['outcome']}:{s['rule_code']}"[:9]
        cost = _cost_of({**s, "currency": next((k[5:].upper() for k in s if k.startswith("cost_")), "USD")})
        out.append(f"  {s['n']:>2}  {outcome:<9} {s['context_tokens']:>7}  {s['context_growth']:>+6}  "
                   f"{s['completion_tokens']:>5}  {cost:<9}  {tools[:20]:<20}  {bar}")
    return "\n".join(out) + "\n"
