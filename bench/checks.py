"""The checks' own cost, in process: µs per check of a body, as the gateway runs them on the event loop
(`chatgate.gateway.checking.check_now`: R1 as DeepSeek reads JSON, then the family's rules), and the family's
rules alone.

    python -m bench.checks               # the plain 6 KB chat body and the agent's round-2 body
    python -m bench.checks --number 5000 --repeat 9

The bodies: `plain` is bench.bodies' agent body (what `bench.pair --plain` posts); `round2` is the tool
loop's second round (bench.toolloop, thinking, the assistant's tool call with its reasoning_content, the
tool's result), as a careful client sends it; `round2-dropped` the same without the reasoning_content (what
LangChain sends: one problem found, which chatgate's repair then fixes). Timed in the process's CPU time
(time spent waiting for a core on a shared machine is not counted), the best of `--repeat` runs (the least
disturbed).
"""

from __future__ import annotations

import argparse
import gc
import time
import timeit
from collections.abc import Callable

import orjson

from bench.bodies import agent_body
from bench.toolloop import round1, round2
from bench.upstream import TOOL_REASONING, _tool_call
from chatgate.gateway.checking import check_now
from chatgate.gateway.endpoints import families
from chatgate.settings import Settings


def bodies() -> dict[str, bytes]:
    call = {**_tool_call(None), "id": "call_0123456789abcdef"}
    first = round1(stream=False)
    return {
        "plain": orjson.dumps(agent_body(stream=False)),
        "round2": orjson.dumps(round2(first, call, TOOL_REASONING)),
        "round2-dropped": orjson.dumps(round2(first, call, None)),
    }


def best_us(work: Callable[[], object], number: int, repeat: int) -> float:
    gc.collect()
    return min(timeit.repeat(work, timer=time.process_time, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--number", type=int, default=2000, help="checks per run")
    parser.add_argument("--repeat", type=int, default=7, help="runs (the best is printed)")
    args = parser.parse_args()
    chat = next(f for f in families(Settings()) if f.name == "openai-chat")
    print(f"{'body':<16}{'bytes':>7}{'problems':>10}{'check_now µs':>14}{'rules µs':>10}")
    for name, body in bodies().items():
        verdict = check_now(chat, body, False, None)
        assert not verdict.problems or name == "round2-dropped", verdict.problems
        full = best_us(lambda b=body: check_now(chat, b, False, None), args.number, args.repeat)  # type: ignore[misc]
        rules = best_us(lambda b=body: chat.check(b, beta=False, origin=None), args.number,  # type: ignore[misc]
                        args.repeat)
        print(f"{name:<16}{len(body):>7}{len(verdict.problems) + len(verdict.warnings):>10}{full:>14.1f}"
              f"{rules:>10.1f}")


if __name__ == "__main__":
    main()
