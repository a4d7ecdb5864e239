"""What the cache advisor's fingerprinting costs per request, on the benchmark's chat bodies (bench.bodies).

Times, in this process, the work `Ledger.sketch` and `Ledger.finish` add per served request when
`cache.breaks` is on (`chatgate.metering.cache.Advisor.assess`: the sketch and its settlement at once): as the
gateway does it, from the body's bytes (a request that repeats a remembered one's bytes and appends messages
takes its hashes and hashes only the new messages), and, for comparison, from the parsed request alone
(every part serialised and hashed: the first request of a caller, or a body not written as orjson writes
it). Each conversation is replayed as an agent would send it: every request extends the previous one by a
message, so the comparison runs against a full memory. The first request of each replay has no earlier one
to extend: it is cut from the request either way.
With `--parse`, the body's JSON parse is counted as well. Compare the figures with a request's CPU in
chatgate (`python -m bench.pair`, µs per request): the share is the throughput cost. About 10 seconds.

    python -m bench.fingerprint            # µs per request, per body
    python -m bench.fingerprint --parse    # the body's orjson parse included
    python -m bench.fingerprint --touch 0 1 8
                                           # scenario 11's tool loop with 0, 1 and 8 MB of other memory
                                           # touched between requests (a server's caches are cold)
    python -m bench.fingerprint --instructions [plain|loop|conv]
                                           # instructions per request of assess() under callgrind, as the
                                           # gateway calls it (the chat family's check first, its parse
                                           # kept): plain = the 6 KB body again and again, loop = scenario
                                           # 11's two rounds (bench.toolloop), conv = an agent conversation
                                           # of 8 growing requests (the 6 KB body's history); about 1 min
                                           # each; --tree DIR: a checkout or git archive instead
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.bodies import agent_body, big_body_bytes, history_body
from bench.common import PACKAGES, REPO_DIR, package_of
from chatgate.metering.cache import Advisor
from chatgate.openai.prompt import CHAT_PROMPT


def _rounds(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """n requests of one conversation: the body's messages cut at n growing lengths (the last is whole)."""
    messages = body["messages"]
    cuts = [max(2, len(messages) - n + 1 + i) for i in range(n)]
    return [{**body, "messages": messages[:cut]} for cut in cuts]


def measure(name: str, body: dict[str, Any], parse: bool, repeat: int) -> str:
    """µs per request of assess() on freshly parsed bodies (as a server has them: strings not yet hashed),
    from the bytes and from the request alone; the parse is made before the clock starts unless `parse`."""
    rounds = _rounds(body, 8)
    raws = [orjson.dumps(b) for b in rounds]
    spent: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(repeat):
        for from_bytes in (True, False):
            advisor = Advisor(True, 8, 64 * 1024 * 1024)
            copies = [bytes(bytearray(raw)) for raw in raws]  # fresh objects: no hash cached in them
            datas = [] if parse else [orjson.loads(raw) for raw in copies]
            started = time.perf_counter()
            for i, raw in enumerate(copies):
                data = orjson.loads(raw) if parse else datas[i]
                advisor.assess(CHAT_PROMPT, "caller", data, dict, 10_000 + i, 9_000, f"req-{i}",
                               raw if from_bytes else b"", data)
            spent[from_bytes].append((time.perf_counter() - started) / len(raws) * 1e6)
    cost = {k: statistics.median(v) for k, v in spent.items()}
    n = len(body["messages"])
    return (f"{name:<24} {len(raws[-1]) / 1024:>8.1f} KB {n:>5} messages  {cost[True]:>8.1f} µs per request "
            f"from bytes, {cost[False]:>8.1f} from the request{' (parse included)' if parse else ''} "
            f"(median of {repeat})")


def touched(megabytes: float, requests: int = 3000) -> str:
    """µs per request of assess() on scenario 11's tool loop (16 callers, each body checked by the chat
    family first, as the gateway does), with `megabytes` of other memory written and read between requests,
    as a request's other work does in a server: only assess() is timed. In a server the advisor's work finds
    the CPU's caches cold; run back to back (0 MB) it does not."""
    from bench.toolloop import round1, round2
    from bench.upstream import TOOL_REASONING
    from chatgate import wire
    from chatgate.gateway.checking import check_now
    from chatgate.openai.chat import ChatFamily
    from chatgate.settings import Settings

    family, first = ChatFamily(Settings().policy()), round1(False)
    junk = bytearray(int(megabytes * (1 << 20)))
    objects = [{"n": i, "s": str(i)} for i in range(int(megabytes * 60_000))]
    ones = b"\x01" * (len(junk) // 64)
    spent: dict[int, list[int]] = {1: [], 2: []}
    advisor = Advisor(True, 8, 64 * 1024 * 1024)
    for i in range(requests):
        loop = i // 2
        if i % 2 == 0:
            body = orjson.dumps(first)
        else:
            call = {"id": f"call_{loop * 7919:016x}", "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path":"app/server.py"}'}}
            body = orjson.dumps(round2(first, call, TOOL_REASONING))
        verdict = check_now(family, body, False, None)
        parsed = wire.kept(body)
        if junk:
            junk[::64] = ones
            sum(o["n"] for o in objects[::3])
        started = time.perf_counter_ns()
        advisor.assess(CHAT_PROMPT, f"caller-{loop % 16}", verdict.request, dict, 3000, 2900, f"r{i}",
                       body, parsed)
        if i >= 200:
            spent[1 + i % 2].append(time.perf_counter_ns() - started)
    one, two = (statistics.mean(spent[k]) / 1000 for k in (1, 2))
    return (f"tool loop, {megabytes:g} MB touched between requests: {(one + two) / 2:6.1f} µs per request "
            f"(round 1 {one:.1f}, round 2 {two:.1f}; mean of {requests - 200})")


COUNTED = 400  # requests counted per run of `_counted`


def _bodies(scenario: str) -> list[bytes]:
    from bench.toolloop import round1, round2

    if scenario == "plain":
        return [orjson.dumps(agent_body(False))]
    if scenario == "loop":
        first, bodies = round1(False), []
        for i in range(8):
            call = {"id": f"call_{i:08d}", "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path":"app/server.py"}'}}
            bodies += [orjson.dumps(first), orjson.dumps(round2(first, call, "thinking " * 20))]
        return bodies
    return [orjson.dumps(b) for b in _rounds(agent_body(False), 8)]


def _counted(scenario: str, assess: bool, package: str) -> None:
    """COUNTED requests checked by the chat family as the gateway checks them, and assessed if `assess`,
    inside functools.reduce (what callgrind's --toggle-collect counts). `package`: the tree's (--tree),
    `chatgate` or, in a tree from before the rename, `app`."""
    import importlib
    import inspect

    def of(module: str) -> Any:
        return importlib.import_module(f"{package}.{module}")

    wire, check_now = of("wire"), of("gateway.checking").check_now
    Advisor = of("metering.cache").Advisor  # the tree's class, not this module's
    ChatFamily, Settings = of("openai.chat").ChatFamily, of("settings").Settings

    family, bodies = ChatFamily(Settings().policy()), _bodies(scenario)
    advisor = Advisor(True, 8, 64 * 1024 * 1024)
    kept = getattr(wire, "kept", lambda body: None)
    with_bytes = "body" in inspect.signature(advisor.assess).parameters  # not before the bytes path
    try:  # the route's family's prompt shape, or (before it) the route's path
        route = of("openai.prompt").CHAT_PROMPT
    except (ImportError, AttributeError):
        route = "/chat/completions"
    callers = [f"caller-{k}" for k in range(16)]

    def step(_: None, i: int) -> None:
        body = bytes(bytearray(bodies[i % len(bodies)]))  # a fresh object, as each request's is
        verdict = check_now(family, body, False, None)
        parsed = kept(body)
        caller, request_id = callers[i // len(bodies) % 16], f"req-{i}"  # the gateway has them made
        if assess:
            extra = (body, parsed) if with_bytes else ()
            advisor.assess(route, caller, verdict.request, dict, 10_000 + i, 9_000, request_id,
                           *extra)

    for i in range(len(bodies) * 16):  # every caller's memory full before the count
        step(None, i)
    functools.reduce(step, range(len(bodies) * 16, len(bodies) * 16 + COUNTED), None)


def instructions(scenario: str, tree: str | None) -> str:
    """assess()'s instructions per request: two runs under callgrind, with and without it. `tree`: another
    checkout or `git archive` (this file runs as a script, that tree first on the path, its package
    imported: `chatgate`, or `app` before the rename)."""
    paths = [os.path.abspath(tree)] if tree is not None else []
    package = package_of(Path(tree).resolve()) if tree is not None else PACKAGES[0]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(REPO_DIR)])}
    totals = []
    for assess in (True, False):
        with tempfile.NamedTemporaryFile(prefix="fingerprint-", suffix=".callgrind") as out:
            subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no",
                            "--toggle-collect=functools_reduce", f"--callgrind-out-file={out.name}",
                            sys.executable, os.path.abspath(__file__), "--counted", scenario,
                            "--package", package, *(["--assess"] if assess else [])],
                           check=True, capture_output=True, env=env, cwd=tree or REPO_DIR)
            found = re.findall(rb"^(?:summary|totals): (\d+)", out.read(), re.M)
            totals.append(max(int(n) for n in found))
    return (f"{scenario}: {(totals[0] - totals[1]) / COUNTED:,.0f} instructions per request in assess() "
            f"(the check alone {totals[1] / COUNTED:,.0f})")


def main(argv: list[str] | None = None) -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--parse", action="store_true", help="count the body's JSON parse too")
    parser.add_argument("--instructions", nargs="*", choices=["plain", "loop", "conv"], metavar="SCENARIO",
                        help="instructions per request under callgrind (default: all three)")
    parser.add_argument("--tree", help="--instructions: this checkout or git archive's package instead")
    parser.add_argument("--touch", nargs="+", type=float, metavar="MB",
                        help="the tool loop with MB of other memory touched between requests (0: none)")
    parser.add_argument("--counted", choices=["plain", "loop", "conv"], help=argparse.SUPPRESS)
    parser.add_argument("--package", default=PACKAGES[0], help=argparse.SUPPRESS)
    parser.add_argument("--assess", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.counted:
        _counted(args.counted, args.assess, args.package)
        return
    if args.touch:
        for megabytes in args.touch:
            print(touched(megabytes), flush=True)
        return
    if args.instructions is not None:
        for scenario in args.instructions or ["plain", "loop", "conv"]:
            print(instructions(scenario, args.tree), flush=True)
        return
    bodies = [("agent step (~6 KB)", agent_body(False), 400),
              ("1,000-message history", history_body(1000, 200), 20),
              ("4 MB history", orjson.loads(big_body_bytes()), 3)]
    for name, body, repeat in bodies:
        print(measure(name, body, args.parse, repeat), flush=True)


if __name__ == "__main__":
    main()
