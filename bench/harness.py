"""An independent harness for issue 49's speed lines: chatgate against a do-nothing passthrough, same stack.

    python -m bench.harness [--quick] [--base COMMIT]

Every process is started here, nothing is shared with `bench.run`'s scenarios but the fake DeepSeek
(`bench.upstream`) and wrk's script (`bench/wrk_post.lua`):

- reference: the smallest FastAPI app that forwards the body bytes with httpx2 on httpx-aiohttp and returns
  the answer (streamed with `aiter_raw`), uvicorn with uvloop and httptools, one worker, no access log. It is
  written here (`python -m bench.harness reference`), apart from bench/reference.py.
- chatgate-default: `python -m chatgate serve --upstream …` and nothing else: passthrough auth, the default
  store (SQLite in the per-user data directory, a temp dir here through XDG_DATA_HOME), the access log on, the
  cache advisor and restore_reasoning on: what a user gets.
- chatgate-all: managed mode, a client key with a budget, rpm, tpm and max_concurrent (scenario 14's
  everything-on).
- with `--base COMMIT`: base-default and base-all, the same two run from that commit's tree (`git archive`
  into the temp dir, `PYTHONPATH` on it), so that before / after is one run.

Bodies: the plain 6 KB agent step of bench/bodies.py and the agent's round-2 body (bench/toolloop.py
`round2_body`: system + user, the tool call with its reasoning, the tool result). Each at c=1 and c=16,
streamed and not, loaded by wrk (keep-alive, one thread) on every target in turn, the order rotated every
round; figures are medians over the rounds, and "added" and "x reference" are the medians of the per-round
differences and ratios against the reference measured in the same round. The load average is recorded with
every configuration. Options swap one factor at a time (`--client python`, `--close`, `--pin`,
`--upstream-delay`, `--env`) for docs/performance.md's "Two harnesses, one answer".
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from httpx_aiohttp.httpx2 import AiohttpTransport
from starlette.background import BackgroundTask

from bench.bodies import write_bodies
from bench.common import (
    BENCH_DIR,
    REPO_DIR,
    Proc,
    free_port,
    group_cpu_seconds,
    load_average,
    package_of,
    post_once,
    raise_nofile_limit,
    wait_ready,
    warm_up,
)
from bench.measure import Context, Settings, _pin_group, side_by_side, with_cpu
from bench.report import ScenarioResult
from bench.scenarios_product import LIMITS
from bench.scenarios_refactor import materialize
from bench.stats import median, summarize_ms
from bench.targets import C1_ADDED_CPU_US, C1_ADDED_P50_MS, C16_RATIO, Target, TargetSpec, remove_tree
from bench.wrkload import run_wrk

REF, DEFAULT, ALL_ON, BASE_DEFAULT, BASE_ALL = "reference", "default", "all", "base-default", "base-all"
AUTH = "Bearer sk-bench"
BODIES = {"plain": ("small", "small_stream"), "round2": ("round2", "round2_stream")}
ISSUE49_BASE = "f0cf9a0"  # main before issue 49's refactor: `--before-after` is `--base` with it


# --- the reference: a do-nothing passthrough on chatgate's stack -----------------------------------------


def reference_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench.harness reference")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--gc", action="store_true", help="chatgate's garbage-collector settings")
    args = parser.parse_args(argv)
    url = args.upstream.rstrip("/") + "/chat/completions"
    limits = httpx2.Limits(max_connections=1000, max_keepalive_connections=1000)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with httpx2.AsyncClient(transport=AiohttpTransport(limits=limits), timeout=60.0) as client:
            app.state.client = client
            yield

    app = FastAPI(lifespan=lifespan)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        client: httpx2.AsyncClient = request.app.state.client
        headers = {"content-type": "application/json",
                   "authorization": request.headers.get("authorization", "")}
        sent = client.build_request("POST", url, content=await request.body(), headers=headers)
        resp = await client.send(sent, stream=True)
        kind = resp.headers.get("content-type", "application/json")
        if kind.startswith("text/event-stream"):
            return StreamingResponse(resp.aiter_raw(), resp.status_code, media_type=kind,
                                     background=BackgroundTask(resp.aclose))
        try:
            return Response(await resp.aread(), resp.status_code, media_type=kind)
        finally:
            await resp.aclose()

    if args.gc:  # what `chatgate serve` does (chatgate.cli.tune_gc), written out so as not to import chatgate
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 50, 100)
    uvicorn.run(app, host="127.0.0.1", port=args.port, workers=1, loop="uvloop", http="httptools",
                log_level="warning", access_log=False)


# --- a Python load client, to swap the load client as a factor ------------------------------------------


def client_main(argv: list[str]) -> None:
    """Closed loop of c connections with aiohttp on uvloop; prints a BENCH_JSON line like wrk's."""
    import aiohttp
    import uvloop

    parser = argparse.ArgumentParser(prog="bench.harness client")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--body", type=Path, required=True)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--auth", default=AUTH)
    parser.add_argument("--close", action="store_true", help="a new connection per request")
    args = parser.parse_args(argv)
    body = args.body.read_bytes()
    headers = {"Content-Type": "application/json", "Authorization": args.auth}
    url = f"http://127.0.0.1:{args.port}/v1/chat/completions"

    async def run() -> dict[str, Any]:
        latencies: list[float] = []
        errors = 0
        connector = aiohttp.TCPConnector(limit=0, force_close=args.close)
        async with aiohttp.ClientSession(connector=connector) as session:
            async def worker(deadline: float) -> None:
                nonlocal errors
                while time.perf_counter() < deadline:
                    start = time.perf_counter()
                    async with session.post(url, data=body, headers=headers) as resp:
                        await resp.read()
                        if resp.status != 200:
                            errors += 1
                            continue
                    latencies.append(time.perf_counter() - start)
            t0 = time.perf_counter()
            await asyncio.gather(*(worker(t0 + args.seconds) for _ in range(args.connections)))
            elapsed = time.perf_counter() - t0
        return {"rps": len(latencies) / elapsed, "requests": len(latencies), "errors": errors,
                **summarize_ms(latencies)}

    print("BENCH_JSON " + json.dumps(uvloop.run(run())), flush=True)


# --- the run --------------------------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    proc: Proc
    port: int
    auth: str = AUTH


@dataclass
class Config:
    body: str  # "plain" | "round2"
    connections: int
    stream: bool

    @property
    def label(self) -> str:
        return f"{self.body} c={self.connections}{' stream' if self.stream else ''}"


@dataclass
class Outcome:
    config: Config
    rounds: list[dict[str, dict[str, float]]] = field(default_factory=list)
    load: list[str] = field(default_factory=list)


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"not NAME=VALUE: {pair!r}")
        out[name] = value
    return out


def _create_key(tree: Path, store_url: str, workdir: Path) -> str:
    argv = [sys.executable, "-m", package_of(tree), "keys", "create", "--team", "bench", "--name", "bench",
            *LIMITS, "--store", store_url]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATGATE_")}
    env["PYTHONPATH"] = str(tree)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=workdir, check=False)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        why = (out.stderr or out.stdout)[-400:]
        raise RuntimeError(f"keys create ({tree}) exited {out.returncode}: {why}")
    return f"Bearer {lines[-1].strip()}"


def _chatgate(name: str, tree: Path, upstream: str, workdir: Path, managed: bool,
              extra_env: dict[str, str]) -> Server:
    """`python -m chatgate serve` from `tree` (PYTHONPATH; `-m app` in a tree from before the rename), its
    data directory and cwd in a temp dir of its own."""
    home = workdir / name
    (home / "data").mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [sys.executable, "-m", package_of(tree), "serve", "--host", "127.0.0.1", "--port", str(port),
            "--upstream", upstream]
    env = {"PYTHONPATH": str(tree), "XDG_DATA_HOME": str(home / "data"), **extra_env}
    auth = AUTH
    if managed:
        store = f"sqlite:///{home / 'all.db'}"
        auth = _create_key(tree, store, home)
        argv += ["--auth", "managed", "--store", store]
        env["DEEPSEEK_API_KEY"] = "sk-bench-upstream"
    proc = Proc(name, argv, workdir / "logs" / f"{name}.log", env=env, cwd=home)
    return Server(name, proc, port, auth)


def _measure(s: Server, body: Path, cfg: Config, seconds: int, args: argparse.Namespace) -> dict[str, float]:
    """One load run on one target, with the CPU time (user + system) its processes spent per request."""
    cpu0 = group_cpu_seconds(s.proc.pid)
    sample = _load(s, body, cfg, seconds, args)
    sample["cpu_us"] = (group_cpu_seconds(s.proc.pid) - cpu0) * 1e6 / max(sample["requests"], 1)
    return sample


def _load(s: Server, body: Path, cfg: Config, seconds: int, args: argparse.Namespace) -> dict[str, float]:
    if args.client == "python":
        argv = [sys.executable, "-m", "bench.harness", "client", "--port", str(s.port), "--body", str(body),
                "--connections", str(cfg.connections), "--seconds", str(seconds), "--auth", s.auth]
        out = subprocess.run(argv + (["--close"] if args.close else []), capture_output=True, text=True,
                             timeout=seconds + 60, cwd=REPO_DIR, check=False)
        for line in out.stdout.splitlines():
            if line.startswith("BENCH_JSON "):
                raw: dict[str, float] = json.loads(line[len("BENCH_JSON "):])
                return raw
        raise RuntimeError(f"client failed: {out.stderr[-400:]}")
    if args.close:
        os.environ["BENCH_CLOSE"] = "1"
    return run_wrk(s.port, body, cfg.connections, seconds, authorization=s.auth).as_dict()


def _pin(servers: list[Server], upstream: Proc) -> set[int]:
    """The servers on the last CPU, the upstream and this process (hence the load tools) on the others."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return set()
    for s in servers:
        _pin_group(s.proc.pid, {cpus[-1]})
    _pin_group(upstream.pid, set(cpus[:-1]))
    os.sched_setaffinity(0, set(cpus[:-1]))
    return set(cpus[:-1])


def run(args: argparse.Namespace) -> int:
    raise_nofile_limit()
    for name in [k for k in os.environ if k.startswith("CHATGATE_")]:
        os.environ.pop(name)
    rounds = args.rounds or (1 if args.quick else 3)
    seconds = args.seconds or (1 if args.quick else 3)
    workdir = Path(tempfile.mkdtemp(prefix="chatgate-harness-"))
    (workdir / "logs").mkdir()
    bodies = write_bodies(workdir / "bodies")
    meta: dict[str, Any] = {
        "started": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "rounds": rounds,
        "seconds": seconds, "load_start": load_average(), "commit": _commit(REPO_DIR),
        "client": f"{args.client}{' (a new connection per request)' if args.close else ' (keep-alive)'}",
        "pinned": args.pin, "upstream_delay_ms": args.upstream_delay, "env": args.env,
        "warm_load_s": args.warm_load, "hogs": args.hog,
    }
    base_tree = None
    if args.base:
        base_tree = workdir / "base"
        problem, sha = materialize(args.base, base_tree)
        if problem:
            print(f"--base: {problem}", file=sys.stderr)
            return 2
        meta["base"] = sha[:12]
    procs: list[Proc] = []
    outcomes: list[Outcome] = []
    try:
        up_port = free_port()
        delay = str(args.upstream_delay / 1000)
        upstream = Proc("upstream", [sys.executable, "-m", "bench.upstream", "--port", str(up_port),
                                     "--delay", delay], workdir / "logs" / "upstream.log")
        procs.append(upstream)
        upstream.start()
        ready = bodies["small"].read_bytes()
        if why := wait_ready(upstream, up_port, ready, 20):
            raise RuntimeError(f"upstream: {why}")
        url = f"http://127.0.0.1:{up_port}"
        port = free_port()
        servers = [Server(REF, Proc(REF, [sys.executable, "-m", "bench.harness", "reference", "--port",
                                          str(port), "--upstream", url], workdir / "logs" / "reference.log"),
                          port)]
        if args.repo_reference:  # bench/reference.py, scenario 14's reference, beside this one
            port = free_port()
            servers.append(Server("reference-repo", Proc("reference-repo", [
                sys.executable, "-m", "bench.reference", "--port", str(port), "--upstream", url],
                workdir / "logs" / "reference-repo.log"), port))
        if args.reference_gc:  # the reference with chatgate's garbage-collector settings
            port = free_port()
            servers.append(Server("reference-gc", Proc("reference-gc", [
                sys.executable, "-m", "bench.harness", "reference", "--gc", "--port", str(port), "--upstream",
                url], workdir / "logs" / "reference-gc.log"), port))
        env = _env_pairs(args.env)
        for variant in args.variant:  # this tree's default with settings of its own, a factor at a time
            name, _, pairs = variant.partition(":")
            own = {**env, **_env_pairs(pairs.split())}
            servers.append(_chatgate(name, REPO_DIR, url, workdir, False, own))
        wanted = [t for t in args.targets.split(",") if t]
        trees = [(DEFAULT, ALL_ON, REPO_DIR)] + ([(BASE_DEFAULT, BASE_ALL, base_tree)] if base_tree else [])
        for d_name, a_name, tree in trees:
            if d_name.removeprefix("base-") in wanted:
                servers.append(_chatgate(d_name, tree, url, workdir, False, env))
            if a_name.removeprefix("base-") in wanted:
                servers.append(_chatgate(a_name, tree, url, workdir, True, env))
        for s in servers:
            procs.append(s.proc)
            s.proc.start()
        for s in servers:
            if why := wait_ready(s.proc, s.port, ready, 60, s.auth):
                raise RuntimeError(f"{s.name}: {why}\n{s.proc.log_tail()}")
        warm = [bodies[b].read_bytes() for pair in BODIES.values() for b in pair]
        for s in servers:
            for raw in warm:  # every body is answered 200 by every target before anything is timed
                status, answer = post_once(s.port, raw, authorization=s.auth)
                if status != 200:
                    raise RuntimeError(f"{s.name} answered {status}: {answer[:300]!r}")
            warm_up(s.port, warm, 100 if args.quick else 400, s.auth)
            if args.warm_load:  # as scenario 14's c=1 comes after its c=16 rounds
                run_wrk(s.port, bodies["small"], 16, args.warm_load, authorization=s.auth)
        for i in range(args.hog):  # the machine's other work, made to order: a busy loop per hog
            hog = Proc(f"hog-{i}", [sys.executable, "-c", "while True: pass"], workdir / "logs" / "hog.log")
            procs.append(hog)
            hog.start()
        if args.pin:
            meta["pinned"] = f"servers on CPU {sorted(os.sched_getaffinity(0))[-1]}, upstream and load on " \
                             f"{sorted(_pin(servers, upstream))}"
        kinds = {"both": (False, True), "no": (False,), "only": (True,)}[args.streams]
        configs = [Config(b, c, st) for b in args.bodies.split(",") for c in args.connections for st in kinds]
        for cfg in configs:
            body = bodies[BODIES[cfg.body][1 if cfg.stream else 0]]
            out = Outcome(cfg)
            out.load.append(load_average())
            for r in range(rounds):
                k = r % len(servers)
                got: dict[str, dict[str, float]] = {}
                for s in servers[k:] + servers[:k]:
                    got[s.name] = _measure(s, body, cfg, seconds, args)
                out.rounds.append(got)
                print(f"  {cfg.label} round {r + 1}: " + "; ".join(
                    f"{n} {x['rps']:.0f}/s p50 {x['p50_ms']:.3f}" for n, x in got.items()), file=sys.stderr)
            out.load.append(load_average())
            outcomes.append(out)
        if base_tree is not None and not args.pin:
            meta["side_by_side"] = _against_base(args, servers, upstream, bodies, workdir, seconds)
    finally:
        for p in reversed(procs):
            p.stop()
        meta["load_end"] = load_average()
        if not args.keep:
            remove_tree(workdir)
    text = report(meta, outcomes)
    print(text)
    out_dir = BENCH_DIR / "results"
    out_dir.mkdir(exist_ok=True)
    (out_dir / "harness-latest.md").write_text(text)
    (out_dir / "harness-latest.json").write_text(json.dumps(
        {"meta": meta, "outcomes": [{"config": o.config.__dict__, "rounds": o.rounds, "load": o.load}
                                    for o in outcomes]}, indent=1))
    return 0


def _against_base(args: argparse.Namespace, servers: list[Server], upstream: Proc, bodies: dict[str, Path],
                  workdir: Path, seconds: int) -> list[dict[str, Any]]:
    """This tree's chatgates against the base tree's, c=16 non-streamed, as bench.pair measures them: both
    loaded at once, both pinned to one CPU, so that a round's ratio is their CPU per request (±1-2% where
    rounds taken one after the other move by tens of percent on a busy host)."""
    by_name = {s.name: s for s in servers}
    ctx = Context(Settings.make(args.quick), bodies, workdir, None, lambda line: print(line, file=sys.stderr))
    res = ScenarioResult("base", "this tree / the base tree", [])
    out: list[dict[str, Any]] = []
    for body in args.bodies.split(","):
        for this, base in ((DEFAULT, BASE_DEFAULT), (ALL_ON, BASE_ALL)):
            if this not in by_name or base not in by_name:
                continue
            twins = [Target(TargetSpec(n, "chatgate"), by_name[n].port, by_name[n].proc)
                     for n in (this, base)]
            others = [upstream] + [s.proc for s in servers if s.name not in (this, base)]
            auth = {n: by_name[n].auth for n in (this, base)}
            path = bodies[BODIES[body][0]]

            def measure(t: Target, path: Path = path, auth: dict[str, str] = auth) -> dict[str, Any]:
                return run_wrk(t.port, path, 16, seconds, authorization=auth[t.name]).as_dict()

            count = 3 if args.quick else 6
            rounds = side_by_side(ctx, res, twins, others, with_cpu(measure), f"{body} ", count)
            ratios = [r[base]["cpu_us"] / r[this]["cpu_us"] for r in rounds if this in r and base in r]
            out.append({"body": body, "this": this, "base": base, "ratios": ratios, "load": load_average()})
    return out


def _commit(tree: Path) -> str:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True, check=False)
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return (out.stdout.strip() or "?") + (" + edits" if dirty else "")


def _per_round(o: Outcome, name: str, other: str, fn: Any) -> float:
    values = [fn(r[name], r[other]) for r in o.rounds if name in r and other in r]
    return median(values)


def report(meta: dict[str, Any], outcomes: list[Outcome]) -> str:
    lines = [
        f"# bench.harness, {meta['started']}", "",
        f"commit {meta['commit']}" + (f", base {meta['base']}" if meta.get("base") else "")
        + f"; {meta['rounds']} round(s) of {meta['seconds']} s per target and configuration, round-robin; "
        f"load client {meta['client']}; pinned: {meta['pinned'] or 'no'}; upstream delay "
        f"{meta['upstream_delay_ms']} ms; extra env {meta['env'] or 'none'}; busy loops beside "
        f"{meta['hogs']}; load average "
        f"{meta['load_start']} at the start, {meta.get('load_end', '?')} at the end", "",
        "| configuration | target | p50 ms | p99 ms | req/s | CPU µs/req | added p50 ms | added 1/req/s ms "
        "| added CPU µs | x reference | x reference, CPU | x base | x base, CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    checks: list[str] = []
    for o in outcomes:
        names = list(o.rounds[0]) if o.rounds else []
        order = [REF, DEFAULT, BASE_DEFAULT, ALL_ON, BASE_ALL]
        for name in sorted(names, key=lambda n: order.index(n) if n in order else len(order)):
            med = {k: median([r[name][k] for r in o.rounds if name in r])
                   for k in ("p50_ms", "p99_ms", "rps", "cpu_us")}
            cells = [o.config.label + f" (load {o.load[0]})", name, f"{med['p50_ms']:.3f}",
                     f"{med['p99_ms']:.3f}", f"{med['rps']:.0f}", f"{med['cpu_us']:.0f}"]
            if name == REF:
                cells += ["", "", "", "", "", "", ""]
            else:
                added = _per_round(o, name, REF, lambda a, b: a["p50_ms"] - b["p50_ms"])
                ratio = _per_round(o, name, REF, lambda a, b: a["rps"] / b["rps"])
                base = "base-" + name if not name.startswith("base-") else ""
                vs_base = (_per_round(o, name, base, lambda a, b: a["rps"] / b["rps"])
                           if base in names else None)
                vs_base_cpu = (_per_round(o, name, base, lambda a, b: b["cpu_us"] / a["cpu_us"])
                               if base in names else None)
                cpu_ratio = _per_round(o, name, REF, lambda a, b: b["cpu_us"] / a["cpu_us"])
                c = o.config.connections
                per_req = _per_round(o, name, REF, lambda a, b, c=c: c * (1e3 / a["rps"] - 1e3 / b["rps"]))
                cpu = _per_round(o, name, REF, lambda a, b: a["cpu_us"] - b["cpu_us"])
                cells += [f"{added:+.3f}", f"{per_req:+.3f}", f"{cpu:+.0f}", f"{ratio:.3f}",
                          f"{cpu_ratio:.3f}", "" if vs_base is None else f"{vs_base:.3f}",
                          "" if vs_base_cpu is None else f"{vs_base_cpu:.3f}"]
                if name == DEFAULT and o.config.connections == 1:
                    ok = added <= C1_ADDED_P50_MS
                    checks.append(f"- {'PASS' if ok else 'FAIL'} {o.config.label}: default adds "
                                  f"{added:.3f} ms p50 over the reference (≤ {C1_ADDED_P50_MS:g})")
                    ok = cpu <= C1_ADDED_CPU_US
                    checks.append(f"- {'PASS' if ok else 'FAIL'} {o.config.label}: default adds {cpu:.0f} µs "
                                  f"of CPU per request over the reference (≤ {C1_ADDED_CPU_US:g}; "
                                  f"req/s {ratio:.3f}x)")
                if name == DEFAULT and o.config.connections == 16:
                    ok = ratio >= C16_RATIO
                    checks.append(f"- {'PASS' if ok else 'FAIL'} {o.config.label}: default {ratio:.3f}x the "
                                  f"reference's req/s (≥ {C16_RATIO:g})")
                    ok = cpu_ratio >= C16_RATIO
                    checks.append(f"- {'PASS' if ok else 'FAIL'} {o.config.label}: default "
                                  f"{cpu_ratio:.3f}x the reference's CPU efficiency (its CPU per request "
                                  f"over the default's, ≥ {C16_RATIO:g})")
            lines.append("| " + " | ".join(cells) + " |")
            errors = sum(int(r[name].get("errors", 0)) for r in o.rounds if name in r)
            if errors:
                checks.append(f"- FAIL {o.config.label}: {name} answered {errors} requests with an error")
    pairs = meta.get("side_by_side") or []
    if pairs:
        lines += ["", "This tree against the base tree side by side (c=16, non-streamed, both loaded at once "
                  "and pinned to one CPU, as `bench.pair` measures): the base's CPU per request over this "
                  "tree's (above 1: this tree is cheaper), median of the rounds", "",
                  "| body | chatgate | this / base | rounds (min, max) | load |", "|---|---|---|---|---|"]
        for p in pairs:
            r = p["ratios"]
            if r:
                lines.append(f"| {p['body']} | {p['this']} | {median(r):.3f} | {len(r)} ({min(r):.3f}, "
                             f"{max(r):.3f}) | {p['load']} |")
    lines += ["", "added p50 and x reference: medians of the per-round differences / ratios against the "
              "reference measured in the same round; added 1/req/s: the same for the mean time a request "
              "takes (c / req/s), what a throughput ratio says in ms; CPU µs/req: user + system time of the "
              "target's processes per request served (added: over the reference's, per round); x reference, "
              "CPU: the reference's CPU per request over the target's; x base: this tree's req/s over the "
              "base tree's, per round, and x base, CPU: the base tree's CPU per request over this tree's "
              "(above 1: this tree is cheaper). The CPU figures move least with the host's load.",
              "", *checks, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["reference"]:
        reference_main(argv[1:])
        return 0
    if argv[:1] == ["client"]:
        client_main(argv[1:])
        return 0
    if argv[:1] == ["report"]:  # render a run's JSON again: python -m bench.harness report FILE.json
        raw = json.loads(Path(argv[1]).read_text())
        print(report(raw["meta"], [Outcome(Config(**o["config"]), o["rounds"], o["load"])
                                   for o in raw["outcomes"]]))
        return 0
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--quick", action="store_true", help="one round of 1 s per measurement")
    parser.add_argument("--base", metavar="COMMIT", help="also run chatgate from this commit's tree")
    parser.add_argument("--before-after", action="store_true",
                        help=f"issue 49's table: --base {ISSUE49_BASE} (main before the refactor)")
    parser.add_argument("--rounds", type=int, help="rounds per configuration (default 3, quick 1)")
    parser.add_argument("--seconds", type=int, help="seconds per measurement (default 3, quick 1)")
    parser.add_argument("--bodies", default="plain,round2")
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--streams", choices=("both", "no", "only"), default="both")
    parser.add_argument("--targets", default="default,all", help="chatgate targets: default,all")
    parser.add_argument("--client", choices=("wrk", "python"), default="wrk")
    parser.add_argument("--close", action="store_true", help="a new connection per request")
    parser.add_argument("--pin", action="store_true",
                        help="the servers on one CPU, the upstream and the load on the other")
    parser.add_argument("--upstream-delay", type=float, default=0.0, metavar="MS", help="the fake's delay")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="chatgate's setting")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:A=1 B=2",
                        help="one more target: this tree's default chatgate with these settings")
    parser.add_argument("--repo-reference", action="store_true",
                        help="bench/reference.py as one more target")
    parser.add_argument("--reference-gc", action="store_true",
                        help="the reference with chatgate's garbage-collector settings as one more target")
    parser.add_argument("--warm-load", type=int, default=0, metavar="S",
                        help="wrk c=16 for S s on each target first")
    parser.add_argument("--hog", type=int, default=0, metavar="N", help="N busy loops running beside")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, stores)")
    args = parser.parse_args(argv)
    if args.before_after:
        args.base = args.base or ISSUE49_BASE
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
