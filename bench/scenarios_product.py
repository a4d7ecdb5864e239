"""Scenario 14 (issue 36): the whole product against the reference passthrough, the figure that is gated.

Each feature was measured against itself switched off and passed its own line, but users run all of them at
once and their costs add up; this scenario measures them together:

- chatgate-default: `chatgate serve` with nothing configured: passthrough auth, the SQLite store, the default
  repairs (restore_reasoning on), the access log on.
- chatgate-all: everything on: managed mode with a client key that has a budget, rpm, tpm and max_concurrent
  (high enough never to refuse, so every kind is checked and settled on every request), restore_reasoning on;
  the context guard and tracing off, as by default.
- reference: bench/reference.py (FastAPI + httpx2 over aiohttp, no checks, no metering).

c=16, non-streaming and streaming: each chatgate against the reference **side by side** (bench/measure.py
`side_by_side`: both loaded at once by their own wrk, both pinned to one CPU, upstream and wrk on the other),
so a round's ratio is their CPU cost per request. c=1: wrk on the three in rotated order (not pinned, a
latency needs the whole machine), the p50 added over the reference's.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from bench.common import AUTH_HEADER, VENV_BIN, warm_up
from bench.measure import Context, alternating, round_ratios, side_by_side, spread, with_cpu, wrk_sample
from bench.report import Column, ScenarioResult
from bench.stats import median
from bench.targets import (
    C1_ADDED_CPU_US,
    C1_ADDED_P50_MS,
    C16_RATIO,
    REFERENCE,
    Cluster,
    Target,
    TargetSpec,
    UpstreamSpec,
)

DEFAULT, ALL_ON, REF = "chatgate-default", "chatgate-all", REFERENCE.name
ROUNDS_FACTOR = 3
# The lines of issues 36 and 49, against the reference measured in the same run: the default's in
# bench/targets.py (C16_RATIO, C1_ADDED_P50_MS and the harsher C1_ADDED_CPU_US, docs/performance.md's
# "Two harnesses, one answer"), everything on's here.
DEFAULT_RATIO, DEFAULT_STREAM_RATIO, ALL_RATIO, ADDED_P50_MS = C16_RATIO, C16_RATIO, 0.9, C1_ADDED_P50_MS
LIMITS = ("--budget-usd", "1000000", "--budget-period", "month", "--rpm", "10000000", "--tpm",
          str(10**12), "--max-concurrent", "10000")


def create_key(store_url: str) -> str:
    """A managed client key with limits on every kind, in the store at `store_url`; returns its secret."""
    argv = [str(VENV_BIN / "chatgate"), "keys", "create", "--team", "bench", "--name", "bench", *LIMITS,
            "--store", store_url]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATGATE_")}
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        why = (out.stderr or out.stdout)[-300:]
        raise RuntimeError(f"`chatgate keys create` exited {out.returncode}: {why}")
    return lines[-1].strip()


def _rounds(ctx: Context) -> int:
    return 1 if ctx.settings.quick else ctx.settings.reps * ROUNDS_FACTOR


BODIES = {"14": ("small", "small_stream", ""), "15": ("round2", "round2_stream", "round-2 body ")}
TITLES = {
    "14": "the whole product: chatgate with its default configuration, and with everything on, against the "
          "reference (c=16 side by side, c=1 rotated)",
    "15": "the agent's round-2 body (system + user, the tool call with its reasoning, the tool result): "
          "chatgate with its default configuration, and with everything on, against the reference (c=16 side "
          "by side, c=1 rotated)",
}


def run_product_group(ctx: Context, only: set[str]) -> list[ScenarioResult]:
    """Scenarios 14 (the plain 6 KB agent step) and 15 (the agent's round-2 body) on one cluster."""
    keys_wanted = [k for k in ("14", "15") if k in only]
    results = {k: _result(k) for k in keys_wanted}
    lines = {(DEFAULT, "c16_"): DEFAULT_RATIO, (DEFAULT, "c16s_"): DEFAULT_STREAM_RATIO,
             (ALL_ON, "c16_"): ALL_RATIO, (ALL_ON, "c16s_"): ALL_RATIO}
    if ctx.chatgate_problem:
        for k, res in results.items():
            for (name, tag), line in lines.items():
                res.skip(_line_name(name, tag, BODIES[k][2]), f"≥ {line:g}", ctx.chatgate_problem)
        return list(results.values())
    store = f"sqlite:///{ctx.workdir / (ALL_ON + '.db')}"
    Path(store.removeprefix("sqlite:///")).unlink(missing_ok=True)
    secret = create_key(store)
    keys = {DEFAULT: AUTH_HEADER, ALL_ON: f"Bearer {secret}", REF: AUTH_HEADER}
    specs = [REFERENCE, TargetSpec(DEFAULT, "chatgate"),
             TargetSpec(ALL_ON, "chatgate", auth="managed", store_url=store, authorization=keys[ALL_ON],
                        env=(("DEEPSEEK_API_KEY", "sk-bench-upstream"),))]
    s = ctx.settings
    warm = [ctx.bodies[b].read_bytes() for k in keys_wanted for b in BODIES[k][:2]]
    with Cluster("product", UpstreamSpec(), specs, ctx.workdir, warm[0], ctx.chatgate_problem) as cl:
        ref = cl.live([REF])[0]
        for t in cl.live([REF, DEFAULT, ALL_ON]):
            warm_up(t.port, warm, 100 if s.quick else 300, keys[t.name])
        for k, res in results.items():
            plain, streamed, label = BODIES[k]
            for name in (DEFAULT, ALL_ON):
                live = cl.live([name])
                if not live:
                    why = cl.skipped([name]).get(name, "not started")
                    for (n, tag), line in lines.items():
                        if n == name:
                            res.skip(_line_name(n, tag, label), f"≥ {line:g}", why)
                    continue
                twin = live[0]
                others = [p for p in cl.procs if p not in (twin.proc, ref.proc)]  # the upstream
                for tag, body in (("c16_", ctx.bodies[plain]), ("c16s_", ctx.bodies[streamed])):
                    measure = with_cpu(_wrk(keys, body, 16, s.wrk_seconds))
                    rounds = side_by_side(ctx, res, [twin, ref], others, measure, tag, _rounds(ctx))
                    _ratio_line(res, name, tag, rounds, lines[(name, tag)], label)
            targets = cl.live([REF, DEFAULT, ALL_ON])
            for tag, body in (("c1_", ctx.bodies[plain]), ("c1s_", ctx.bodies[streamed])):
                measure = with_cpu(_wrk(keys, body, 1, s.wrk_seconds))
                per_round = alternating(ctx, res, targets, measure, tag, _rounds(ctx))
                _added_lines(res, tag, per_round, label)
            res.notes.append(_note(_rounds(ctx)))
    return list(results.values())


def _note(rounds: int) -> str:
    return (f"{DEFAULT}: chatgate serve with no configuration (passthrough, SQLite, restore_reasoning on, "
            f"access log on); {ALL_ON}: managed mode, a client key with a budget, rpm, tpm and "
            "max_concurrent that never refuse (every kind checked and settled per request), "
            "restore_reasoning on; the context guard and tracing off. c=16: each chatgate and the reference "
            "side by side, pinned to one CPU (their CPU per request); c=1: the three in rotated order. "
            f"{rounds} round(s) per measurement; a ratio or an added p50 is the median of the per-round "
            "figures")


def _result(key: str) -> ScenarioResult:
    return ScenarioResult(
        key,
        TITLES[key],
        [
            Column("c16_rps", "c=16 req/s", "{:.0f}"),
            Column("c16_ratio", "x reference", "{:.3f}"),
            Column("c16_cpu_us", "CPU µs/req", "{:.0f}"),
            Column("c16s_rps", "c=16 stream req/s", "{:.0f}"),
            Column("c16s_ratio", "x reference", "{:.3f}"),
            Column("c16s_cpu_us", "CPU µs/req", "{:.0f}"),
            Column("c1_p50_ms", "c=1 p50 ms", "{:.3f}"),
            Column("c1_added_ms", "added p50 ms", "{:.3f}"),
            Column("c1_added_cpu_us", "added CPU µs/req", "{:.0f}"),
            Column("c1_ratio", "c=1 x reference", "{:.3f}"),
            Column("c1s_p50_ms", "c=1 stream p50 ms", "{:.3f}"),
            Column("c1s_added_ms", "added p50 ms", "{:.3f}"),
            Column("c1s_added_cpu_us", "added CPU µs/req", "{:.0f}"),
            Column("c1s_ratio", "c=1 x reference", "{:.3f}"),
        ],
    )


def _line_name(name: str, tag: str, label: str = "") -> str:
    kind = "streaming" if tag == "c16s_" else "non-streaming"
    return f"{name} / reference req/s at c=16, {label}{kind} (side by side)"


def _wrk(keys: dict[str, str], body: Path, connections: int, seconds: int) -> Any:
    def measure(t: Target) -> dict[str, Any]:
        return wrk_sample(t, body, connections, seconds, authorization=keys[t.name])
    return measure


def _ratio_line(res: ScenarioResult, name: str, tag: str, rounds: list[dict[str, dict[str, Any]]],
                line: float, label: str) -> None:
    ratios = round_ratios(rounds, name, REF, "rps")
    if not ratios:
        res.skip(_line_name(name, tag, label), f"≥ {line:g}", "no measurement")
        return
    ratio = median(ratios)
    res.rows[name][tag + "ratio"] = ratio
    rps = {n: median([r[n]["rps"] for r in rounds if n in r]) for n in (name, REF)}
    cpu = {n: median([r[n].get("cpu_us", 0.0) for r in rounds if n in r]) for n in (name, REF)}
    errors = sum(int(x.get("errors", 0)) for r in rounds for x in r.values())
    res.check(_line_name(name, tag, label), ratio >= line and errors == 0, f"{ratio:.3f}", f"≥ {line:g}",
              f"{spread(ratios, '{:.3f}')}; {rps[name]:.0f} vs {rps[REF]:.0f} req/s, CPU {cpu[name]:.0f} vs "
              f"{cpu[REF]:.0f} µs per request; {errors} errors")


def _added_lines(res: ScenarioResult, tag: str, per_round: list[dict[str, dict[str, Any]]],
                 label: str) -> None:
    """c=1: the p50 added over the reference, and the harsher form of the same line, the CPU time added per
    request (which an idle second core or the upstream's latency cannot hide, and the host's load moves
    little)."""
    kind = "streaming" if tag == "c1s_" else "non-streaming"
    for name in (DEFAULT, ALL_ON):
        both = [r for r in per_round if name in r and REF in r]
        if not both:
            continue
        added = [r[name]["p50_ms"] - r[REF]["p50_ms"] for r in both]
        cpu = [r[name]["cpu_us"] - r[REF]["cpu_us"] for r in both]
        row = res.rows.setdefault(name, {})
        row[tag + "added_ms"], row[tag + "added_cpu_us"] = median(added), median(cpu)
        row[tag + "ratio"] = median([r[name]["rps"] / r[REF]["rps"] for r in both if r[REF]["rps"]])
        if name == DEFAULT:
            res.check(f"{name} c=1 p50 added over the reference, {label}{kind}",
                      median(added) <= ADDED_P50_MS, f"{median(added):.3f} ms", f"≤ {ADDED_P50_MS:g} ms",
                      spread(added, "{:.3f}"))
            res.check(f"{name} c=1 CPU per request added over the reference, {label}{kind}",
                      median(cpu) <= C1_ADDED_CPU_US, f"{median(cpu):.0f} µs", f"≤ {C1_ADDED_CPU_US:g} µs",
                      f"{spread(cpu, '{:.0f}')}; c=1 req/s {row[tag + 'ratio']:.3f}x the reference's")
