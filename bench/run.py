"""One command for the whole benchmark: `.venv/bin/python -m bench.run [--quick]` (or `bench/run.py`).

Starts the fake upstream, the reference passthroughs and chatgate (each its own process group), drives
them with wrk and the Python generators, prints the markdown report and writes bench/results/latest.{md,json}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bodies import write_bodies
from bench.common import BENCH_DIR, REPO_DIR, load_average, raise_nofile_limit
from bench.measure import Context, Settings
from bench.report import Column, ScenarioResult, write_reports
from bench.scenarios_fast import run_fast_group
from bench.scenarios_limits import limits
from bench.scenarios_load import long_streams, slow_upstream
from bench.scenarios_product import run_product_group
from bench.scenarios_refactor import refactor
from bench.scenarios_repairs import repairs
from bench.targets import chatgate_available, remove_tree
from bench.validation import BUDGET_MS
from bench.validation import run as run_validation
from bench.wrkload import wrk_available

ALL = ["1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15"]
FAST_GROUP = {"1", "2", "3", "6", "8", "9", "10"}


def _on_sigterm(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt(f"signal {signum}")


def validation_scenario(settings: Settings) -> ScenarioResult:
    out = run_validation(settings.validation_runs)
    res = ScenarioResult(
        "7",
        f"validation alone, in process: {out['messages']}-message history, "
        f"{out['tool_pairs']} tool-call pairs "
        f"({out['body_bytes'] / 1024:.0f} KB)",
        [
            Column("median_ms", "median ms", "{:.3f}"),
            Column("p99_ms", "p99 ms", "{:.3f}"),
            Column("json_loads_ms", "json.loads ms", "{:.3f}"),
            Column("runs", "runs", "{:.0f}"),
        ],
    )
    if out.get("skipped"):
        res.skip("validation median", f"≤ {BUDGET_MS:g} ms", str(out.get("note")))
        return res
    keys = ("median_ms", "p99_ms", "json_loads_ms", "runs")
    res.rows["chatgate.openai.rules"] = {k: float(out[k]) for k in keys}
    res.samples["chatgate.openai.rules"] = [out]
    res.notes.append(f"API timed: {out.get('api')}; result on this body: {out.get('outcome')}")
    if not out.get("valid", True):
        res.notes.append(
            "the validator reported problems on this valid body: check bench/bodies.py or the rules"
        )
    res.check(
        "validation median",
        out["median_ms"] <= BUDGET_MS,
        f"{out['median_ms']:.3f} ms",
        f"≤ {BUDGET_MS:g} ms",
    )
    return res


def _meta(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    def version(pkg: str) -> str:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "absent"

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_DIR, capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit = "?"
    # a `git archive` copy (run quietly, apart from a checkout being edited) is named by whoever made it
    commit = os.environ.get("BENCH_COMMIT") or commit
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        wrk_version = subprocess.run(["wrk", "--version"], capture_output=True, text=True, check=False).stdout
        wrk_version = wrk_version.splitlines()[0] if wrk_version else "?"
    except OSError:
        wrk_version = "absent"
    return {
        "mode": "quick" if settings.quick else "full",
        "reps": settings.reps,
        "settings": settings.__dict__,
        "started": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit or "?",
        "machine": f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}",
        "versions": {
            p: version(p)
            for p in (
                "uvicorn",
                "fastapi",
                "httpx2",
                "httpx-aiohttp",
                "aiohttp",
                "uvloop",
                "httptools",
                "chatgate",
            )
        },
        "wrk": wrk_version,
        "only": args.only,
        "load_average_start": load_average(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="chatgate benchmark: every target side by side, one run")
    parser.add_argument("--quick", action="store_true", help="CI mode: small loads, one repetition (< 2 min)")
    parser.add_argument("--reps", type=int, help="repetitions per measurement (default 3, quick 1)")
    parser.add_argument("--duration", type=int, help="seconds per wrk measurement (default 5, quick 1)")
    parser.add_argument("--streams", type=int, help="scenario 5: concurrent streams (2000; quick 200)")
    parser.add_argument("--only", default=",".join(ALL), help="comma-separated scenario numbers, e.g. 1,2,7")
    parser.add_argument("--skip-chatgate", action="store_true", help="benchmark only the reference targets")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results", help="where latest.md/json go")
    parser.add_argument("--keep-workdir", action="store_true", help="keep the temp dir (logs, bodies, dbs)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when any target line fails")
    args = parser.parse_args(argv)
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    unknown = only - set(ALL)
    if unknown:
        parser.error(f"unknown scenarios: {sorted(unknown)}")

    signal.signal(signal.SIGTERM, _on_sigterm)
    nofile = raise_nofile_limit()
    settings = Settings.make(args.quick, args.reps, args.duration, args.streams)
    started = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    if not wrk_available():
        print("wrk is not installed: apt-get install -y wrk", file=sys.stderr)
        return 2
    if nofile < 2 * settings.streams + 512:
        log(f"note: open-file limit is {nofile}; long streams may run out of sockets")

    workdir = Path(tempfile.mkdtemp(prefix="chatgate-bench-"))
    chatgate_problem = "--skip-chatgate" if args.skip_chatgate else chatgate_available()
    if chatgate_problem:
        log(f"note: chatgate targets are skipped: {chatgate_problem}")
    meta = _meta(args, settings)
    meta["chatgate"] = chatgate_problem or "available"
    results: list[ScenarioResult] = []
    interrupted = None
    try:
        log(f"mode {meta['mode']}, {settings.reps} rep(s), workdir {workdir}")
        bodies = write_bodies(workdir / "bodies")
        ctx = Context(settings, bodies, workdir, chatgate_problem, log)
        groups: list[tuple[str, Callable[[], list[ScenarioResult]]]] = [
            ("scenario 7: validation in process", lambda: [validation_scenario(settings)]),
            ("fast upstream group", lambda: run_fast_group(ctx, only)),
            ("scenario 4: slow upstream, open loop", lambda: [slow_upstream(ctx)]),
            ("scenario 5: long streams", lambda: [long_streams(ctx)]),
            ("scenario 11: repairs (restore_reasoning on vs off)", lambda: [repairs(ctx)]),
            ("scenario 12: chat route before/after the API-family refactor", lambda: [refactor(ctx)]),
            ("scenario 13: limits", lambda: [limits(ctx)]),
            ("scenarios 14-15: the whole product against the reference, plain and round-2 bodies",
             lambda: run_product_group(ctx, only)),
        ]
        wanted = ["7" in only, bool(only & FAST_GROUP), "4" in only, "5" in only]
        wanted += ["11" in only, "12" in only, "13" in only, bool(only & {"14", "15"})]
        for (label, run_group), want in zip(groups, wanted, strict=True):
            if not want:
                continue
            log(label)
            try:
                results += run_group()
            except Exception as exc:  # report it, go on with the other groups
                log(f"{label} FAILED: {type(exc).__name__}: {exc}")
                meta.setdefault("errors", []).append(f"{label}: {type(exc).__name__}: {exc}"[:1000])
    except KeyboardInterrupt as exc:
        interrupted = f"interrupted ({exc}); partial results"
        log(interrupted)
    finally:
        results.sort(key=lambda r: int(r.key))
        meta["elapsed_s"] = round(time.monotonic() - started, 1)
        meta["load_average_end"] = load_average()
        if interrupted:
            meta["interrupted"] = interrupted
        md_path, json_path = write_reports(args.out, meta, results)
        if args.keep_workdir:
            log(f"kept {workdir}")
        else:
            remove_tree(workdir)
    print(md_path.read_text())
    log(f"wrote {md_path} and {json_path} in {meta['elapsed_s']} s")
    if chatgate_problem and not args.skip_chatgate:
        again = chatgate_available()
        log(
            "note: chatgate is available now; rerun to include it"
            if not again
            else f"note: chatgate still unavailable: {again}"
        )
    failed = any(c.status == "FAIL" for r in results for c in r.checks)
    return 1 if (args.strict and failed) or interrupted else 0


if __name__ == "__main__":
    raise SystemExit(main())
