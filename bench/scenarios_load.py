"""Scenarios with a slow or long-streaming upstream: 4 (open-loop, 1.5 s answers) and 5 (long streams)."""

from __future__ import annotations

from typing import Any

from bench.measure import Context, round_robin, run_tool
from bench.report import Column, ScenarioResult
from bench.targets import (
    AIOHTTP_FLOOR,
    CHATGATE,
    DIRECT,
    REFERENCE,
    REFERENCE_HTTPX,
    Cluster,
    MemorySampler,
    Target,
    TargetSpec,
    UpstreamSpec,
)

MB = 1024.0


def _specs(ctx: Context) -> list[TargetSpec]:
    if ctx.settings.quick:  # CI budget: direct and the transport comparison only in full runs
        return [REFERENCE, CHATGATE]
    return [DIRECT, REFERENCE, REFERENCE_HTTPX, AIOHTTP_FLOOR, CHATGATE]


def _skip_reason(cl: Cluster) -> str:
    t = cl.targets.get("chatgate")
    return (t.skipped if t else "chatgate not started") or ""


def slow_upstream(ctx: Context) -> ScenarioResult:
    s = ctx.settings
    in_flight = s.slow_rate * s.slow_delay_s
    res = ScenarioResult(
        "4",
        f"slow upstream: {s.slow_delay_s:g} s answers, open loop {s.slow_rate:g} req/s "
        f"for {s.slow_seconds:g} s "
        f"(≈{in_flight:.0f} in flight)",
        [
            Column("offered", "offered", "{:.0f}"),
            Column("served_pct", "served %", "{:.1f}"),
            Column("errors", "errors", "{:.0f}"),
            Column("p50_ms", "p50 ms", "{:.0f}"),
            Column("p99_ms", "p99 ms", "{:.0f}"),
            Column("max_ms", "max ms", "{:.0f}"),
            Column("peak_rss_mb", "peak RSS MB", "{:.1f}"),
        ],
    )
    ready = ctx.bodies["small"].read_bytes()
    up = UpstreamSpec(delay_s=s.slow_delay_s)
    with Cluster("slow", up, _specs(ctx), ctx.workdir, ready, ctx.chatgate_problem) as cl:
        targets = cl.live([spec.name for spec in _specs(ctx)])

        def measure(t: Target) -> dict[str, Any]:
            args = ["--port", str(t.port), "--body", str(ctx.bodies["small"]), "--rate", str(s.slow_rate)]
            args += ["--duration", str(s.slow_seconds), "--timeout", "10"]
            with MemorySampler(t) as sampler:
                out = run_tool("bench.openloop", args, s.slow_seconds + 60)
            out["peak_rss_mb"] = sampler.peak_kb / MB
            return out

        round_robin(ctx, res, targets, measure)
        res.notes.append(
            "latency is measured from each request's scheduled send time; direct's RSS is the upstream's"
        )
        kinds = {
            n: [x.get("error_kinds") for x in smp if x.get("error_kinds")] for n, smp in res.samples.items()
        }
        if any(kinds.values()):
            res.notes.append(f"error kinds: { {k: v for k, v in kinds.items() if v} }")
        row = res.rows.get("chatgate")
        if row is None:
            why = _skip_reason(cl)
            for name, target in (
                ("served", "≥ 98%"),
                ("errors", "0"),
                ("p99", f"≤ {s.slow_delay_s * 1000 + 100:.0f} ms"),
            ):
                res.skip(f"chatgate {name}", target, why)
            return res
        budget = s.slow_delay_s * 1000 + 100
        res.check("chatgate served", row["served_pct"] >= 98.0, f"{row['served_pct']:.1f}%", "≥ 98%")
        res.check("chatgate errors", row["errors"] == 0, f"{row['errors']:.0f}", "0")
        res.check("chatgate p99", row["p99_ms"] <= budget, f"{row['p99_ms']:.0f} ms", f"≤ {budget:.0f} ms")
    return res


def long_streams(ctx: Context) -> ScenarioResult:
    s = ctx.settings
    chunks = max(1, round(s.stream_seconds / s.stream_interval_s) - 1)
    events_per_stream = chunks + 2  # deltas + usage chunk + [DONE], every one spaced by the interval
    expected = s.streams * events_per_stream
    res = ScenarioResult(
        "5",
        f"long streams: {s.streams:,} concurrent streams of {s.stream_seconds:g} s, an event every "
        f"{s.stream_interval_s * 1000:.0f} ms ({events_per_stream} events each)",
        [
            Column("completed", "completed", "{:.0f}"),
            Column("events", "events", "{:.0f}"),
            Column("coalesced_reads", "coalesced reads", "{:.0f}"),
            Column("gap_p50_ms", "gap p50 ms", "{:.1f}"),
            Column("gap_p99_ms", "gap p99 ms", "{:.1f}"),
            Column("added_gap_p99_ms", "added gap p99 ms", "{:.1f}"),
            Column("gap_max_ms", "gap max ms", "{:.0f}"),
            Column("first_event_p99_ms", "first event p99 ms", "{:.0f}"),
            Column("duration_max_s", "longest stream s", "{:.1f}"),
            Column("peak_rss_mb", "peak RSS MB", "{:.1f}"),
            Column("hwm_mb", "VmHWM MB", "{:.1f}"),
        ],
    )
    ready = ctx.bodies["small"].read_bytes()
    up = UpstreamSpec(chunks=chunks, chunk_interval_s=s.stream_interval_s)
    with Cluster("streams", up, _specs(ctx), ctx.workdir, ready, ctx.chatgate_problem) as cl:
        targets = cl.live([spec.name for spec in _specs(ctx)])

        def measure(t: Target) -> dict[str, Any]:
            args = ["streams", "--port", str(t.port), "--body", str(ctx.bodies["small_stream"])]
            args += ["--count", str(s.streams), "--ramp", str(s.stream_ramp_s)]
            args += ["--timeout", str(s.stream_seconds + 60), "--interval", str(s.stream_interval_s)]
            with MemorySampler(t) as sampler:
                out = run_tool("bench.streamclient", args, s.stream_ramp_s + s.stream_seconds + 120)
            out["peak_rss_mb"] = sampler.peak_kb / MB
            mem = t.memory()
            out["hwm_mb"] = (mem.hwm_kb / MB) if mem else float("nan")
            return out

        round_robin(ctx, res, targets, measure)
        res.notes.append(
            f"expected {expected:,} events per run; a coalesced read is one socket read with more than one "
            f"event although the upstream spaced them {s.stream_interval_s * 1000:.0f} ms apart; "
            "added gap = observed gap between events minus the interval; first event = from connect to the "
            "first event (new connections wait while the proxy is busy); direct's RSS is the upstream's"
        )
        errs = {n: [x.get("errors") for x in smp if x.get("errors")] for n, smp in res.samples.items()}
        if any(errs.values()):
            res.notes.append(f"stream errors: { {k: v for k, v in errs.items() if v} }")
        samples = res.samples.get("chatgate")
        if not samples:
            why = _skip_reason(cl)
            for name, target in (
                ("chatgate streams completed", "all"),
                ("chatgate events delivered", "all"),
                ("chatgate coalesced reads", "0"),
                ("chatgate added inter-event delay p99", "≤ 10 ms"),
                ("chatgate peak RSS", "≤ 300 MB"),
            ):
                res.skip(name, target, why)
            return res
        worst_completed = min(x["completed"] for x in samples)
        worst_events = min(x["events"] for x in samples)
        worst_coalesced = max(x["coalesced_reads"] for x in samples)
        peak = max(x["peak_rss_mb"] for x in samples)
        res.check(
            "chatgate streams completed (worst rep)",
            worst_completed == s.streams,
            f"{worst_completed:,}/{s.streams:,}",
            "all",
        )
        res.check(
            "chatgate events delivered (worst rep)",
            worst_events == expected,
            f"{worst_events:,}/{expected:,}",
            "all",
        )
        res.check("chatgate coalesced reads (worst rep)", worst_coalesced == 0, f"{worst_coalesced:,}", "0")
        res.check("chatgate peak RSS", peak <= 300.0, f"{peak:.1f} MB", "≤ 300 MB")
        worst_gap = max(x["added_gap_p99_ms"] for x in samples)
        ref = res.rows.get("reference", {}).get("added_gap_p99_ms")
        res.check(
            "chatgate added inter-event delay p99 (worst rep)",
            worst_gap <= 10.0,
            f"{worst_gap:.1f} ms" + (f" (reference {ref:.1f} ms)" if ref is not None else ""),
            "≤ 10 ms",
        )
    return res
