"""Scenarios against the fast upstream: 1 (c=1), 2 (c=16/64), 3 (TTFB), 6 (4 MB body), 8 (metering on/off),
9 (memory after many requests), 10 (workers). One cluster serves them all."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from bench.common import group_cpu_seconds, group_pids, warm_up
from bench.measure import Context, added, median_dict, ratio, round_robin, run_tool, wrk_measure, wrk_sample
from bench.report import Column, ScenarioResult
from bench.stats import median
from bench.targets import (
    AIOHTTP_FLOOR,
    CHATGATE,
    CHATGATE_MEM,
    CHATGATE_METERED,
    CHATGATE_NOMETER,
    CHATGATE_W2,
    DIRECT,
    REFERENCE,
    REFERENCE_HTTPX,
    REFERENCE_MEM,
    REFERENCE_W2,
    Cluster,
    Target,
    TargetSpec,
    UpstreamSpec,
)
from bench.wrkload import run_wrk

MAIN = ["direct", "reference", "reference-httpx", "aiohttp-floor", "chatgate"]
MB = 1024.0


def fast_specs(only: set[str], quick: bool, chatgate_problem: str | None) -> list[TargetSpec]:
    specs = [DIRECT, REFERENCE, REFERENCE_HTTPX, AIOHTTP_FLOOR, CHATGATE]
    if "8" in only:
        specs += [CHATGATE_METERED, CHATGATE_NOMETER]
    if "10" in only:
        specs += [CHATGATE_W2, REFERENCE_W2]
    if "9" in only:
        specs.append(CHATGATE_MEM)
        if not quick or chatgate_problem:  # quick: the reference's memory only when chatgate can't run
            specs.append(REFERENCE_MEM)
    return specs


def run_fast_group(ctx: Context, only: set[str]) -> list[ScenarioResult]:
    ready = ctx.bodies["small"].read_bytes()
    results: dict[str, ScenarioResult] = {}
    with Cluster(
        "fast",
        UpstreamSpec(),
        fast_specs(only, ctx.settings.quick, ctx.chatgate_problem),
        ctx.workdir,
        ready,
        ctx.chatgate_problem,
    ) as cl:
        main = cl.live(MAIN)
        ctx.log("  warm-up")
        small, stream = ctx.bodies["small"].read_bytes(), ctx.bodies["small_stream"].read_bytes()
        for t in main:
            warm_up(t.port, [small, stream], 200)
            if not ctx.settings.quick:
                run_wrk(t.port, ctx.bodies["small"], 64, 1)
        if "6" in only:
            ctx.log("  scenario 6: 4 MB body")
            results["6"] = big_body(ctx, cl, main)
        if "1" in only:
            ctx.log("  scenario 1: c=1")
            results["1"] = c1(ctx, cl, main)
        if "3" in only:
            ctx.log("  scenario 3: streaming TTFB")
            results["3"] = ttfb(ctx, cl, main)
        if "2" in only:
            ctx.log("  scenario 2: c=16 / c=64")
            results["2"] = concurrency(ctx, cl, main)
        if "8" in only:
            ctx.log("  scenario 8: metering on/off")
            results["8"] = metering(ctx, cl)
        if "10" in only:
            ctx.log("  scenario 10: workers")
            results["10"] = workers(ctx, cl)
        if "9" in only:
            ctx.log("  scenario 9: memory over many requests")
            results["9"] = memory(ctx, cl)
    return [results[k] for k in ("1", "2", "3", "6", "8", "9", "10") if k in results]


def _skip_reason(cl: Cluster, name: str) -> str:
    target = cl.targets.get(name)
    if target is None:
        return f"{name} not started"
    return target.skipped or ""


def c1(ctx: Context, cl: Cluster, main: list[Target]) -> ScenarioResult:
    s = ctx.settings
    res = ScenarioResult(
        "1",
        "c=1, latency added over direct (wrk)",
        [
            Column("rps", "req/s", "{:.0f}"),
            Column("p50_ms", "p50 ms", "{:.3f}"),
            Column("p99_ms", "p99 ms", "{:.3f}"),
            Column("added_p50_ms", "added p50 ms", "{:.3f}"),
            Column("stream_rps", "stream req/s", "{:.0f}"),
            Column("stream_p50_ms", "stream p50 ms", "{:.3f}"),
            Column("stream_added_p50_ms", "stream added p50 ms", "{:.3f}"),
        ],
    )
    round_robin(ctx, res, main, wrk_measure(ctx.bodies["small"], 1, s.wrk_seconds))
    if s.extras_streaming:
        round_robin(ctx, res, main, wrk_measure(ctx.bodies["small_stream"], 1, s.wrk_seconds), "stream_")
    else:
        res.columns = res.columns[:4]
        res.notes.append("quick mode: streaming at c=1 is measured by scenario 3 only")
    for name in res.rows:
        res.rows[name]["added_p50_ms"] = added(res, name, "p50_ms") or 0.0
        if s.extras_streaming:
            res.rows[name]["stream_added_p50_ms"] = added(res, name, "stream_p50_ms") or 0.0
    cg, ref = added(res, "chatgate", "p50_ms"), added(res, "reference", "p50_ms")
    if cg is None or ref is None:
        res.skip(
            "chatgate added p50 (non-streaming)", "≤ reference's + 0.15 ms", _skip_reason(cl, "chatgate")
        )
    else:
        res.check(
            "chatgate added p50 (non-streaming)", cg <= ref + 0.15, f"{cg:.3f} ms", f"≤ {ref:.3f} + 0.15 ms"
        )
    return res


def concurrency(ctx: Context, cl: Cluster, main: list[Target]) -> ScenarioResult:
    s = ctx.settings
    configs = [(16, False), (16, True), (64, False), (64, True)]
    columns: list[Column] = []
    for c, stream in configs:
        tag = f"c{c}{'s' if stream else ''}_"
        label = f"c={c}{' stream' if stream else ''}"
        columns += [Column(tag + "rps", f"{label} req/s", "{:.0f}"), Column(tag + "ratio", "xref", "{:.2f}")]
    res = ScenarioResult("2", "throughput at c=16 and c=64, non-streaming and streaming (wrk)", columns)
    for c, stream in configs:
        tag = f"c{c}{'s' if stream else ''}_"
        body = ctx.bodies["small_stream" if stream else "small"]
        round_robin(ctx, res, main, wrk_measure(body, c, s.wrk_seconds), tag)
    for c, stream in configs:
        tag = f"c{c}{'s' if stream else ''}_"
        for name in res.rows:
            r = ratio(res, name, "reference", tag + "rps")
            if r is not None:
                res.rows[name][tag + "ratio"] = r
        name = f"chatgate/reference req/s at c={c}{' streaming' if stream else ''}"
        r = ratio(res, "chatgate", "reference", tag + "rps")
        if r is None:
            res.skip(name, "≥ 0.80", _skip_reason(cl, "chatgate"))
        else:
            res.check(name, r >= 0.8, f"{r:.2f}", "≥ 0.80")
    errors = {n: sum(int(x.get("errors", 0)) for x in smp) for n, smp in res.samples.items()}
    if any(errors.values()):
        res.notes.append(f"wrk errors (all configs, all reps): {errors}")
    return res


def ttfb(ctx: Context, cl: Cluster, main: list[Target]) -> ScenarioResult:
    s = ctx.settings
    res = ScenarioResult(
        "3",
        "streaming time to first event at c=1 (Python client, keep-alive)",
        [
            Column("ttfb_p50_ms", "TTFB p50 ms", "{:.3f}"),
            Column("ttfb_p99_ms", "TTFB p99 ms", "{:.3f}"),
            Column("added_ttfb_p50_ms", "added p50 ms", "{:.3f}"),
            Column("total_p50_ms", "whole stream p50 ms", "{:.3f}"),
            Column("errors", "errors", "{:.0f}"),
        ],
    )

    def measure(t: Target) -> dict[str, Any]:
        args = ["ttfb", "--port", str(t.port), "--body", str(ctx.bodies["small_stream"])]
        args += ["--count", str(s.ttfb_count), "--max-seconds", "60"]
        return run_tool("bench.streamclient", args, 120)

    round_robin(ctx, res, main, measure)
    for name in res.rows:
        res.rows[name]["added_ttfb_p50_ms"] = added(res, name, "ttfb_p50_ms") or 0.0
    cg, ref = added(res, "chatgate", "ttfb_p50_ms"), added(res, "reference", "ttfb_p50_ms")
    if cg is None or ref is None:
        res.skip("chatgate added TTFB p50", "≤ reference's + 0.15 ms", _skip_reason(cl, "chatgate"))
    else:
        res.check("chatgate added TTFB p50", cg <= ref + 0.15, f"{cg:.3f} ms", f"≤ {ref:.3f} + 0.15 ms")
    return res


def big_body(ctx: Context, cl: Cluster, main: list[Target]) -> ScenarioResult:
    s = ctx.settings
    body_path = ctx.bodies["big"]
    raw = body_path.read_bytes()
    loads = []
    for _ in range(5):
        start = time.perf_counter()
        json.loads(raw)
        loads.append(time.perf_counter() - start)
    loads_ms = median(loads) * 1000.0
    size_mb = len(raw) / MB / MB
    res = ScenarioResult(
        "6",
        f"{size_mb:.1f} MB request body (valid {len(json.loads(raw)['messages'])}-message history), c=1",
        [
            Column("p50_ms", "p50 ms", "{:.2f}"),
            Column("p99_ms", "p99 ms", "{:.2f}"),
            Column("added_p50_ms", "added p50 ms", "{:.2f}"),
            Column("hwm_before_mb", "VmHWM before MB", "{:.1f}"),
            Column("hwm_after_mb", "VmHWM after MB", "{:.1f}"),
            Column("hwm_delta_mb", "VmHWM growth MB", "{:.1f}"),
        ],
    )
    res.notes.append(f"json.loads of the body in the runner: {loads_ms:.1f} ms (median of 5)")
    if not s.extras_streaming:
        main = [t for t in main if t.name in ("direct", "reference", "chatgate")]
    # The server process's own memory: chatgate checks a body over 1 MiB in checker processes it starts with
    # the first large body (a fixed cost, each an interpreter with chatgate imported), shown in a note.
    before = {t.name: t.server_memory() for t in main}
    group_before = {t.name: t.memory() for t in main}
    round_robin(ctx, res, main, wrk_measure(body_path, 1, s.big_seconds))
    for t in main:
        row = res.rows.get(t.name)
        if row is None:
            continue
        row["added_p50_ms"] = added(res, t.name, "p50_ms") or 0.0
        after, b = t.server_memory(), before.get(t.name)
        if after is not None and b is not None:
            row.update(
                hwm_before_mb=b.hwm_kb / MB,
                hwm_after_mb=after.hwm_kb / MB,
                hwm_delta_mb=(after.hwm_kb - b.hwm_kb) / MB,
            )
        group_after, gb = t.memory(), group_before.get(t.name)
        if t.proc is not None and group_after is not None and gb is not None and group_after != after:
            res.notes.append(
                f"{t.name} with the processes it started ({len(group_pids(t.proc.pid))} in all): VmHWM "
                f"{gb.hwm_kb / MB:.1f} -> {group_after.hwm_kb / MB:.1f} MB, summed")
    cg = res.rows.get("chatgate")
    if cg is None:
        why = _skip_reason(cl, "chatgate")
        res.skip("chatgate added p50, 4 MB body", f"≤ 3 x json.loads = {3 * loads_ms:.1f} ms", why)
        res.skip("chatgate VmHWM growth, 4 MB body", f"≤ 4 x body = {4 * size_mb:.1f} MB", why)
        return res
    a = cg["added_p50_ms"]
    res.check(
        "chatgate added p50, 4 MB body",
        a <= 3 * loads_ms,
        f"{a:.1f} ms",
        f"≤ 3 x json.loads = {3 * loads_ms:.1f} ms",
    )
    d = cg.get("hwm_delta_mb")
    if d is None:
        res.skip("chatgate VmHWM growth, 4 MB body", f"≤ {4 * size_mb:.1f} MB", "memory not readable")
    else:
        res.check(
            "chatgate VmHWM growth, 4 MB body",
            d <= 4 * size_mb,
            f"{d:.1f} MB",
            f"≤ 4 x body = {4 * size_mb:.1f} MB",
        )
    return res


METERING_REP_FACTOR = 3  # metering's 10% line needs more pairs than other scenarios on a noisy machine


def metering(ctx: Context, cl: Cluster) -> ScenarioResult:
    """Two chatgate processes started together and warmed up the same way, one with a SQLite store and
    one without, so only metering differs (not how long a process has been serving). Pairs: each
    repetition measures both back to back, in alternating order, and the cost is the median of the
    per-pair costs, so drifts in machine speed cancel out. CPU per request is reported beside it."""
    s = ctx.settings
    configs = [(False, "")] + ([(True, "stream_")] if s.extras_streaming else [])
    columns = [Column("rps", "c=16 req/s", "{:.0f}"), Column("cpu_us", "CPU µs/request", "{:.0f}")]
    if s.extras_streaming:
        columns += [
            Column("stream_rps", "c=16 stream req/s", "{:.0f}"),
            Column("stream_cpu_us", "stream CPU µs/request", "{:.0f}"),
        ]
    res = ScenarioResult("8", "metering on vs off at c=16 (CHATGATE_STORE_URL=none turns it off)", columns)
    pair = ["chatgate-metered", "chatgate-nometer"]
    targets = cl.live(pair)
    if len(targets) < 2:
        why = "; ".join(f"{k}: {v}" for k, v in cl.skipped(pair).items())
        for _, tag in configs:
            res.skip(
                f"throughput cost of metering{' (streaming)' if tag else ''}", "≤ 10%", why or "not started"
            )
        return res
    small, stream_body = ctx.bodies["small"].read_bytes(), ctx.bodies["small_stream"].read_bytes()
    for t in targets:  # two fresh processes with the same history: only metering differs
        warm_up(t.port, [small, stream_body], 200)
        run_wrk(t.port, ctx.bodies["small"], 16, 1)
    for stream, tag in configs:
        body = ctx.bodies["small_stream" if stream else "small"]
        costs = _metering_pairs(ctx, res, targets, body, tag)
        name = f"throughput cost of metering{' (streaming)' if tag else ''}"
        if not costs:
            res.skip(name, "≤ 10%", "no measurement")
            continue
        cost = median(costs)
        on, off = res.rows["chatgate-metered"][tag + "rps"], res.rows["chatgate-nometer"][tag + "rps"]
        cpu_on = res.rows["chatgate-metered"][tag + "cpu_us"]
        cpu_off = res.rows["chatgate-nometer"][tag + "cpu_us"]
        detail = (
            f"median of {len(costs)} pairs (min {min(costs):.1f}%, max {max(costs):.1f}%); {on:.0f} vs "
            f"{off:.0f} req/s; CPU per request {cpu_on:.0f} vs {cpu_off:.0f} µs"
        )
        res.check(name, cost <= 10.0, f"{cost:.1f}%", "≤ 10%", detail)
    return res


def _metering_pairs(ctx: Context, res: ScenarioResult, targets: list[Target], body: Path, tag: str
                    ) -> list[float]:
    s = ctx.settings
    samples: dict[str, list[dict[str, Any]]] = {t.name: [] for t in targets}
    costs = []
    for rep in range(s.reps * METERING_REP_FACTOR):
        pair = {}
        for t in targets if rep % 2 == 0 else list(reversed(targets)):
            assert t.proc is not None
            cpu0 = group_cpu_seconds(t.proc.pid)
            try:
                sample = wrk_sample(t, body, 16, s.wrk_seconds)
            except Exception as exc:  # one failed measurement must not end the run
                res.notes.append(f"{t.name} {tag} pair {rep + 1} failed: {exc}"[:400])
                continue
            requests = max(sample.get("requests", 0), 1)
            sample["cpu_us"] = (group_cpu_seconds(t.proc.pid) - cpu0) * 1e6 / requests
            pair[t.name] = sample
            samples[t.name].append(sample)
        if len(pair) == 2 and pair["chatgate-nometer"]["rps"] > 0:
            on, off = pair["chatgate-metered"]["rps"], pair["chatgate-nometer"]["rps"]
            costs.append((off - on) / off * 100.0)
            ctx.log(f"    {tag}pair {rep + 1}: {on:.0f} vs {off:.0f} req/s, cost {costs[-1]:.1f}%")
    for name, got in samples.items():
        if got:
            res.samples.setdefault(name, []).extend({**x, "config": tag} for x in got)
            res.rows.setdefault(name, {}).update({tag + k: v for k, v in median_dict(got).items()})
    return costs


def workers(ctx: Context, cl: Cluster) -> ScenarioResult:
    s = ctx.settings
    configs = [(False, "")] + ([(True, "stream_")] if s.extras_streaming else [])
    columns = [Column("rps", "c=64 req/s", "{:.0f}"), Column("ratio", "x1 worker", "{:.2f}")]
    if s.extras_streaming:
        columns += [
            Column("stream_rps", "c=64 stream req/s", "{:.0f}"),
            Column("stream_ratio", "x1 worker", "{:.2f}"),
        ]
    res = ScenarioResult("10", "--workers 2 vs 1 at c=64", columns)
    res.notes.append("the load generator (wrk) and the upstream share the same two cores with the workers")
    names = ["chatgate", "chatgate-w2", "reference", "reference-w2"]
    targets = cl.live(names)
    for stream, tag in configs:
        body = ctx.bodies["small_stream" if stream else "small"]
        round_robin(ctx, res, targets, wrk_measure(body, 64, s.wrk_seconds), tag)
    for one, two in (("chatgate", "chatgate-w2"), ("reference", "reference-w2")):
        for _, tag in configs:
            r = ratio(res, two, one, tag + "rps")
            if r is not None:
                res.rows[two][tag + "ratio"] = r
                res.rows[one][tag + "ratio"] = 1.0
    for _, tag in configs:
        name = f"chatgate 2 workers / 1 worker at c=64{' (streaming)' if tag else ''}"
        r = ratio(res, "chatgate-w2", "chatgate", tag + "rps")
        if r is None:
            why = "; ".join(f"{k}: {v}" for k, v in cl.skipped(["chatgate", "chatgate-w2"]).items())
            res.skip(name, "≥ 1.6x", why or "no measurement")
        else:
            res.check(name, r >= 1.6, f"{r:.2f}x", "≥ 1.6x")
    return res


def memory(ctx: Context, cl: Cluster) -> ScenarioResult:
    s = ctx.settings
    res = ScenarioResult(
        "9",
        f"memory over {s.mem_requests:,} short requests (c=16, alternating non-streaming / streaming)",
        [
            Column("requests", "requests", "{:.0f}"),
            Column("rss_start_mb", "RSS start MB", "{:.1f}"),
            Column("rss_half_mb", "RSS at 50% MB", "{:.1f}"),
            Column("rss_end_mb", "RSS at 100% MB", "{:.1f}"),
            Column("growth_mb", "growth 50→100% MB", "{:.2f}"),
        ],
    )
    for t in cl.live(["chatgate-mem", "reference-mem"]):
        ctx.log(f"    {t.name}: {s.mem_requests} requests")
        res.rows[t.name] = _drive_memory(ctx, t)
        res.samples[t.name] = [dict(res.rows[t.name])]
        reached = res.rows[t.name]["requests"]
        if reached < s.mem_requests:
            res.notes.append(
                f"{t.name}: time cap of {s.mem_max_s:.0f} s reached after {reached:.0f} requests"
            )
    row = res.rows.get("chatgate-mem")
    if row is None:
        why = _skip_reason(cl, "chatgate-mem")
        res.skip("chatgate RSS after all requests", "≤ 100 MB", why)
        res.skip("chatgate RSS flat from 50% to 100%", "growth ≤ max(2 MB, 5%)", why)
        return res
    end, half, growth = row["rss_end_mb"], row["rss_half_mb"], row["growth_mb"]
    res.check("chatgate RSS after all requests", end <= 100.0, f"{end:.1f} MB", "≤ 100 MB")
    allowed = max(2.0, 0.05 * half)
    res.check(
        "chatgate RSS flat from 50% to 100%", growth <= allowed, f"+{growth:.2f} MB", f"≤ +{allowed:.2f} MB"
    )
    return res


def _drive_memory(ctx: Context, t: Target) -> dict[str, float]:
    """Send short requests in wrk slices (alternating bodies) until the count is reached; RSS at 0/50/100%."""
    s = ctx.settings
    rss: dict[str, float] = {}
    mem = t.memory()
    rss["rss_start_mb"] = (mem.rss_kb / MB) if mem else float("nan")
    done = 0
    deadline = time.monotonic() + s.mem_max_s
    bodies = [ctx.bodies["small"], ctx.bodies["small_stream"]]
    i = 0
    for mark, key in ((s.mem_requests // 2, "rss_half_mb"), (s.mem_requests, "rss_end_mb")):
        while done < mark and time.monotonic() < deadline:
            done += run_wrk(t.port, bodies[i % 2], 16, s.mem_slice_s).requests
            i += 1
        mem = t.memory()
        rss[key] = (mem.rss_kb / MB) if mem else float("nan")
        if key == "rss_half_mb":
            rss["requests_half"] = float(done)
    rss["requests"] = float(done)
    rss["growth_mb"] = rss["rss_end_mb"] - rss["rss_half_mb"]
    return rss
