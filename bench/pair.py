"""Two chatgate builds side by side on scenario 11's tool loop (or, with `--plain`, the 6 KB chat body of
bench.bodies under wrk at c=16): is a change to the request path measurable?

A is the tree of a commit (extracted with `git archive`, as scenario 12 does), B this checkout with its
uncommitted edits; or both this checkout, with settings told apart by `--env-a` / `--env-b`. Both serve the
same fake upstream (`bench.upstream --tool-loop`), each with its own SQLite store, and are measured the way
`side_by_side` measures scenario 11's twins: loaded at once, each by its own `bench.toolloop` at c=16, every
thread of both pinned to one CPU (the upstream and the load tools on the others). Each round's ratio is the
twins' CPU per request, A / B: above 1, B is cheaper. Two copies of the same tree, A / A, measured 1.000
(rounds 0.994-1.008) in a quiet hour of a noisy 2-core host and 1.008 (0.961-1.038) in a busy one: the
median of six rounds shows about one percent, in about two minutes, where `bench.inprocess` moves by tens.

    python -m bench.pair HEAD                      # the last commit against the working tree
    python -m bench.pair 389dc11 --careful         # both clients send the reasoning back (nothing to repair)
    python -m bench.pair --env-a CHATGATE_REPAIR_RESTORE_REASONING=false --send-a
                                                   # this checkout, restore off (the client sending the
                                                   # reasoning back) against on: scenario 11's loop line
    python -m bench.pair --plain --env-a CHATGATE_CACHE_BREAKS=false
                                                   # the benchmark's 6 KB chat body (bench.bodies) under wrk
                                                   # at c=16 instead of the tool loop (--stream: streamed)
    python -m bench.pair HEAD --plain --managed    # the same, both twins as scenario 14's everything-on
Prints each round and the median; exits 1 when a twin fails to start or a round has errors.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.bodies import write_bodies
from bench.common import REPO_DIR, package_of
from bench.measure import Context, Settings, run_tool, side_by_side, with_cpu, wrk_sample
from bench.report import ScenarioResult
from bench.scenarios_product import create_key
from bench.scenarios_refactor import imported_from, materialize
from bench.targets import Cluster, Target, TargetSpec, UpstreamSpec

A, B = "a", "b"


def _env(pairs: list[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"not NAME=VALUE: {pair!r}")
        out.append((name, value))
    return tuple(out)


def main(argv: list[str] | None = None) -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("commit", nargs="?", help="A's commit (default: A is this checkout too)")
    parser.add_argument("--env-a", action="append", default=[], metavar="NAME=VALUE", help="A's setting")
    parser.add_argument("--env-b", action="append", default=[], metavar="NAME=VALUE", help="B's setting")
    parser.add_argument("--careful", action="store_true", help="both clients send the reasoning back")
    parser.add_argument("--send-a", action="store_true", help="A's client sends the reasoning back")
    parser.add_argument("--stream", action="store_true", help="the streamed tool loop (or plain body)")
    parser.add_argument("--plain", action="store_true",
                        help="the 6 KB chat body of bench.bodies under wrk at c=16, not the tool loop")
    parser.add_argument("--managed", action="store_true",
                        help="with --plain: both twins as scenario 14's everything-on chatgate (managed "
                             "mode, a key with every kind of limit)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=10, help="per round")
    parser.add_argument("--warm", type=int, default=5, help="seconds of loops on each twin first")
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="chatgate-pair-"))
    tree = REPO_DIR
    if args.commit:
        tree = workdir / "tree-a"
        problem, sha = materialize(args.commit, tree)
        if problem is None and not imported_from(tree).startswith(str(tree)):
            problem = f"`import {package_of(tree)}` with cwd {tree} does not import the extracted tree"
        if problem is not None:
            print(f"A: {problem}", file=sys.stderr)
            return 1
        print(f"A = {args.commit} ({sha[:12]}), B = this checkout ({REPO_DIR})", flush=True)
    if args.managed and not args.plain:
        raise SystemExit("--managed needs --plain")
    keys: dict[str, str] = {}
    specs = []
    for name, env, source in ((A, args.env_a, tree), (B, args.env_b, REPO_DIR)):
        if args.managed:  # scenario 14's chatgate-all: its own store, a key with every kind of limit
            store = f"sqlite:///{workdir / (name + '.db')}"
            keys[name] = f"Bearer {create_key(store)}"
            specs.append(TargetSpec(name, "chatgate", env=(("DEEPSEEK_API_KEY", "sk-bench-upstream"),
                                                           *_env(env)),
                                    source_dir=str(source), auth="managed", store_url=store,
                                    authorization=keys[name]))
        else:
            specs.append(TargetSpec(name, "chatgate", env=_env(env), source_dir=str(source)))
    ctx = Context(Settings.make(False, wrk_seconds=args.seconds), {}, workdir, None,
                  lambda line: print(line, flush=True))
    res = ScenarioResult("pair", "A / B", [])
    ready = b'{"model":"deepseek-v4-flash","messages":[{"role":"user","content":"hi"}]}'

    bodies = write_bodies(workdir / "bodies") if args.plain else {}

    def loop(t: Target, seconds: int) -> dict[str, Any]:
        if args.plain:
            return wrk_sample(t, bodies["small_stream" if args.stream else "small"], 16, seconds,
                              authorization=keys.get(t.name))
        sends = args.careful or (args.send_a and t.name == A)
        extra = ["--stream"] if args.stream else []
        extra += ["--send-reasoning"] if sends else []
        return run_tool("bench.toolloop", ["--port", str(t.port), "--duration", str(seconds),
                                           "--concurrency", "16", *extra], seconds + 60)

    with Cluster("pair", UpstreamSpec(tool_loop=not args.plain), specs, workdir, ready) as cl:
        twins = cl.live([A, B])
        if len(twins) < 2:
            print(f"not started: {cl.skipped([A, B])}", file=sys.stderr)
            return 1
        for t in twins:
            loop(t, args.warm)
        others = [p for p in cl.procs if p not in (twins[0].proc, twins[1].proc)]
        rounds = side_by_side(ctx, res, twins, others, with_cpu(lambda t: loop(t, args.seconds)), "",
                              args.rounds)
    ratios = [r[A]["cpu_us"] / r[B]["cpu_us"] for r in rounds if A in r and B in r and r[B]["cpu_us"]]
    errors = sum(int(r[n].get("errors", 0)) for r in rounds for n in r)
    for i, r in enumerate(rounds, 1):
        if A in r and B in r:
            print(f"round {i}: A {r[A]['cpu_us']:.0f} µs of CPU per request, B {r[B]['cpu_us']:.0f}: "
                  f"A / B {r[A]['cpu_us'] / r[B]['cpu_us']:.3f}")
    if not ratios:
        print("no round measured both twins", file=sys.stderr)
        return 1
    print(f"A / B CPU per request: {statistics.median(ratios):.3f} (median of {len(ratios)} rounds, min "
          f"{min(ratios):.3f}, max {max(ratios):.3f}); {errors} loop errors")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
