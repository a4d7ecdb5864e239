"""What the cache advisor's fingerprinting costs per request, on the benchmark's chat bodies (bench.bodies).

Times, in this process, the work `Ledger.finish` adds per served request when `cache.breaks` is on: cut the
parsed body into parts, hash them, compare with the caller's remembered requests and remember this one
(`app.metering.cache.Advisor.assess`). Each conversation is replayed as an agent would send it: every
request extends the previous one by a message, so the comparison runs against a full memory. With
`--parse`, the body's JSON parse is counted as well (the advisor parses it when no step before it did).
Compare the figures with a request's CPU in chatgate (`python -m bench.pair`, µs per request): the share is
the throughput cost. About 10 seconds.

    python -m bench.fingerprint            # µs per request, per body
    python -m bench.fingerprint --parse    # the body's orjson parse included
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import orjson

from app.metering.cache import Advisor
from bench.bodies import agent_body, big_body_bytes, history_body


def _rounds(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """n requests of one conversation: the body's messages cut at n growing lengths (the last is whole)."""
    messages = body["messages"]
    cuts = [max(2, len(messages) - n + 1 + i) for i in range(n)]
    return [{**body, "messages": messages[:cut]} for cut in cuts]


def measure(name: str, body: dict[str, Any], parse: bool, repeat: int) -> str:
    """µs per request of assess() on freshly parsed bodies (as a server has them: strings not yet hashed),
    the parse's own time taken out unless `parse`."""
    rounds = _rounds(body, 8)
    raws = [orjson.dumps(b) for b in rounds]
    spent, parsing = [], []
    for _ in range(repeat):
        advisor = Advisor(True, 8, 64 * 1024 * 1024)
        started = time.perf_counter()
        for raw in raws:
            orjson.loads(raw)
        parsed = time.perf_counter()
        for i, raw in enumerate(raws):
            data = orjson.loads(raw)
            advisor.assess("/chat/completions", "caller", data, dict, 10_000 + i, 9_000, f"req-{i}")
        done = time.perf_counter()
        parsing.append((parsed - started) / len(raws) * 1e6)
        spent.append((done - parsed) / len(raws) * 1e6)
    cost = statistics.median(spent) - (0 if parse else statistics.median(parsing))
    n = len(body["messages"])
    return (f"{name:<24} {len(raws[-1]) / 1024:>8.1f} KB {n:>5} messages  {cost:>8.1f} µs "
            f"per request{' (parse included)' if parse else ''}; the parse alone "
            f"{statistics.median(parsing):.1f} µs (median of {repeat})")


def main(argv: list[str] | None = None) -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--parse", action="store_true", help="count the body's JSON parse too")
    args = parser.parse_args(argv)
    bodies = [("agent step (~6 KB)", agent_body(False), 400),
              ("1,000-message history", history_body(1000, 200), 20),
              ("4 MB history", orjson.loads(big_body_bytes()), 3)]
    for name, body, repeat in bodies:
        print(measure(name, body, args.parse, repeat), flush=True)


if __name__ == "__main__":
    main()
