"""Run settings, the round-robin loop, and the Python load tools run as subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from bench.common import REPO_DIR, Proc, group_cpu_seconds, group_pids
from bench.report import ScenarioResult
from bench.stats import median
from bench.targets import Target
from bench.wrkload import run_wrk


@dataclass(frozen=True)
class Settings:
    quick: bool
    reps: int
    wrk_seconds: int  # each closed-loop measurement
    ttfb_count: int
    slow_rate: float
    slow_seconds: float
    slow_delay_s: float
    streams: int
    stream_seconds: float
    stream_interval_s: float
    stream_ramp_s: float
    big_seconds: int
    mem_requests: int
    mem_slice_s: int
    mem_max_s: float  # time cap for scenario 9 (the count reached is reported)
    validation_runs: int
    extras_streaming: bool  # streaming also in scenario 1 (wrk), 8 and 10; all transports in 6

    @staticmethod
    def make(
        quick: bool, reps: int | None = None, wrk_seconds: int | None = None, streams: int | None = None
    ) -> Settings:
        if quick:
            s = Settings(True, 1, 1, 100, 100.0, 5.0, 1.5, 200, 5.0, 0.1, 0.5, 1, 10_000, 1, 20.0, 20, False)
        else:
            s = Settings(
                False, 3, 5, 1000, 500.0, 20.0, 1.5, 2000, 30.0, 0.1, 5.0, 5, 100_000, 2, 900.0, 100, True
            )
        overrides = {"reps": reps, "wrk_seconds": wrk_seconds, "streams": streams}
        return Settings(**{**s.__dict__, **{k: v for k, v in overrides.items() if v is not None}})


@dataclass
class Context:
    settings: Settings
    bodies: dict[str, Path]
    workdir: Path
    chatgate_problem: str | None
    log: Callable[[str], None]


def median_dict(samples: list[dict[str, Any]]) -> dict[str, float]:
    keys = [k for k, v in samples[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return {k: median([float(s[k]) for s in samples if k in s]) for k in keys}


def round_robin(
    ctx: Context,
    res: ScenarioResult,
    targets: list[Target],
    measure: Callable[[Target], dict[str, Any]],
    prefix: str = "",
    reps: int | None = None,
) -> None:
    """Each repetition runs every target once, in order; rows get the per-metric medians (keys prefixed)."""
    per_target: dict[str, list[dict[str, Any]]] = {}
    for rep in range(reps or ctx.settings.reps):
        for t in targets:
            started = time.monotonic()
            try:
                sample = measure(t)
            except Exception as exc:  # one failed measurement must not end the run
                res.notes.append(
                    f"{t.name} {prefix or ''} rep {rep + 1} failed: {type(exc).__name__}: {exc}"[:400]
                )
                ctx.log(f"    {t.name}: FAILED {exc}")
                continue
            per_target.setdefault(t.name, []).append(sample)
            ctx.log(
                f"    {prefix}{t.name} rep {rep + 1}: {_brief(sample)} ({time.monotonic() - started:.1f} s)"
            )
    for name, samples in per_target.items():
        res.samples.setdefault(name, []).extend({**s, "config": prefix} for s in samples)
        row = res.rows.setdefault(name, {})
        row.update({prefix + k: v for k, v in median_dict(samples).items()})


class Named(Protocol):
    @property
    def name(self) -> str: ...


N = TypeVar("N", bound=Named)


def alternating(
    ctx: Context,
    res: ScenarioResult,
    targets: list[N],
    measure: Callable[[N], dict[str, Any]],
    prefix: str,
    rounds: int,
) -> list[dict[str, dict[str, Any]]]:
    """A/B rounds (scenario 8's pairs, for any number of targets): each round measures every target once, back
    to back, the order rotated every round (two targets: A B, then B A), so that none is always first. Rows
    get the per-metric medians (keys prefixed); returns each round's {name: sample}, for per-round ratios."""
    per_round: list[dict[str, dict[str, Any]]] = []
    samples: dict[str, list[dict[str, Any]]] = {t.name: [] for t in targets}
    for r in range(rounds):
        k = r % max(len(targets), 1)
        got: dict[str, dict[str, Any]] = {}
        for t in targets[k:] + targets[:k]:
            try:
                sample = measure(t)
            except Exception as exc:  # one failed measurement must not end the run
                res.notes.append(f"{t.name} {prefix} round {r + 1} failed: {type(exc).__name__}: {exc}"[:400])
                ctx.log(f"    {prefix}{t.name}: FAILED {exc}")
                continue
            got[t.name] = sample
            samples[t.name].append(sample)
        per_round.append(got)
        ctx.log(f"    {prefix}round {r + 1}: " + "; ".join(f"{n} {_brief(x)}" for n, x in got.items()))
    _keep(res, samples, prefix)
    return per_round


def _keep(res: ScenarioResult, samples: dict[str, list[dict[str, Any]]], prefix: str) -> None:
    """Every sample into the report's samples, each target's per-metric medians into its row (prefixed)."""
    for name, got_samples in samples.items():
        if got_samples:
            res.samples.setdefault(name, []).extend({**x, "config": prefix} for x in got_samples)
            res.rows.setdefault(name, {}).update({prefix + k: v for k, v in median_dict(got_samples).items()})


def side_by_side(
    ctx: Context,
    res: ScenarioResult,
    twins: list[Target],
    others: list[Proc],
    measure: Callable[[Target], dict[str, Any]],
    prefix: str,
    rounds: int,
) -> list[dict[str, dict[str, Any]]]:
    """A/B rounds in which both twins are measured at the same time, each by its own load tool, with every
    thread of both twins pinned to one and the same CPU and everything else (`others`: the upstream; the load
    tools; this runner) on the other CPUs. Each twin runs in its own session, so the scheduler's autogroups
    share that CPU between the two twins, not between their threads: each gets half of it, whatever the
    noise of the moment, and the per-round ratio is their CPU cost per request (their throughput on a CPU
    of their own), which alternating rounds on a noisy 2-core host only give within +-15%. Rows get the
    per-metric medians (keys prefixed); returns each round's {name: sample}, like `alternating`."""
    per_round: list[dict[str, dict[str, Any]]] = []
    samples: dict[str, list[dict[str, Any]]] = {t.name: [] for t in twins}
    with pinned(twins, others) as load_cpus:
        for r in range(rounds):
            got: dict[str, dict[str, Any]] = {}
            failed: dict[str, BaseException] = {}
            order = twins if r % 2 == 0 else twins[::-1]  # which load tool starts first, rotated
            threads = [
                threading.Thread(target=_measure_on, args=(t, measure, load_cpus, got, failed)) for t in order
            ]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            for name, exc in failed.items():
                res.notes.append(f"{name} {prefix} round {r + 1} failed: {type(exc).__name__}: {exc}"[:400])
                ctx.log(f"    {prefix}{name}: FAILED {exc}")
            for name, sample in got.items():
                samples[name].append(sample)
            per_round.append(got)
            ctx.log(f"    {prefix}round {r + 1} (side by side): "
                    + "; ".join(f"{n} {_brief(x)}" for n, x in got.items()))
    _keep(res, samples, prefix)
    return per_round


def _measure_on(
    t: Target,
    measure: Callable[[Target], dict[str, Any]],
    cpus: set[int],
    got: dict[str, dict[str, Any]],
    failed: dict[str, BaseException],
) -> None:
    """One twin's measurement in a thread of its own, the load tool it starts pinned to `cpus`."""
    if cpus:
        os.sched_setaffinity(0, cpus)  # this thread, hence the processes it starts
    try:
        got[t.name] = measure(t)
    except Exception as exc:  # one failed measurement must not end the run
        failed[t.name] = exc


@contextmanager
def pinned(twins: list[Target], others: list[Proc]) -> Iterator[set[int]]:
    """Pin the twins' threads to the last CPU and `others` to the rest; yields the rest (empty, and nothing
    pinned, on a single CPU). Everything is unpinned afterwards."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        yield set()
        return
    twin_cpu, rest = {cpus[-1]}, set(cpus[:-1])
    groups = [(t.proc.pid, twin_cpu) for t in twins if t.proc is not None]
    groups += [(p.pid, rest) for p in others if p.popen is not None]
    try:
        for pgid, where in groups:
            _pin_group(pgid, where)
        yield rest
    finally:
        for pgid, _ in groups:
            _pin_group(pgid, set(cpus))


def _pin_group(pgid: int, cpus: set[int]) -> None:
    """Every thread of every process in the process group (a server, its workers, their threads)."""
    for pid in group_pids(pgid):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            with contextlib.suppress(OSError):  # the thread has just ended
                os.sched_setaffinity(int(tid), cpus)


def round_ratios(rounds: list[dict[str, dict[str, Any]]], num: str, den: str, metric: str) -> list[float]:
    """num/den of `metric` in every round where both were measured."""
    return [r[num][metric] / r[den][metric] for r in rounds if num in r and den in r and r[den].get(metric)]


def with_cpu(measure: Callable[[Target], dict[str, Any]]) -> Callable[[Target], dict[str, Any]]:
    """Adds `cpu_us`: the CPU time (utime + stime) of the target's process group per request it served."""

    def measured(t: Target) -> dict[str, Any]:
        assert t.proc is not None
        cpu0 = group_cpu_seconds(t.proc.pid)
        sample = measure(t)
        sample["cpu_us"] = (group_cpu_seconds(t.proc.pid) - cpu0) * 1e6 / max(sample.get("requests", 0), 1)
        return sample

    return measured


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """'median of N (min a, max b)' for a detail line."""
    if not values:
        return "no measurement"
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return f"median of {len(values)} round(s) (min {lo}, max {hi})"


def _brief(sample: dict[str, Any]) -> str:
    keys = [
        k
        for k in (
            "rps",
            "p50_ms",
            "p99_ms",
            "ttfb_p50_ms",
            "served_pct",
            "errors",
            "completed",
            "coalesced_reads",
            "added_gap_p99_ms",
        )
        if k in sample
    ]
    return ", ".join(
        f"{k}={sample[k]:.3f}" if isinstance(sample[k], float) else f"{k}={sample[k]}" for k in keys
    )


def wrk_sample(
    target: Target, body: Path, connections: int, seconds: int, authorization: str | None = None
) -> dict[str, Any]:
    if authorization is None:
        return run_wrk(target.port, body, connections, seconds).as_dict()
    return run_wrk(target.port, body, connections, seconds, authorization=authorization).as_dict()


def wrk_measure(body: Path, connections: int, seconds: int) -> Callable[[Target], dict[str, Any]]:
    """A `round_robin` measurement: wrk with this body and concurrency."""

    def measure(target: Target) -> dict[str, Any]:
        return wrk_sample(target, body, connections, seconds)

    return measure


def run_tool(module: str, args: list[str], timeout_s: float) -> dict[str, Any]:
    """Run a bench load tool in its own process and parse its `BENCH_JSON` line."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=str(REPO_DIR),
        check=False,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            result: dict[str, Any] = json.loads(line[len("BENCH_JSON ") :])
            return result
    raise RuntimeError(f"{module} rc={proc.returncode}: {proc.stderr[-600:]}")


def added(res: ScenarioResult, name: str, metric: str, baseline: str = "direct") -> float | None:
    row, base = res.rows.get(name), res.rows.get(baseline)
    if not row or not base or metric not in row or metric not in base:
        return None
    return row[metric] - base[metric]


def ratio(res: ScenarioResult, name: str, other: str, metric: str) -> float | None:
    a, b = res.rows.get(name, {}).get(metric), res.rows.get(other, {}).get(metric)
    if a is None or b is None or b == 0:
        return None
    return a / b
