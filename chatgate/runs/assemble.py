"""Runs put together from usage records when they are read: a pure function of the records.

A record whose run was named (`x-chatgate-run`, its agent's session) or followed by the tracker (a run with
bounds) carries its run's id. Any other record of a request with a history carries its `Link`
(chatgate/runs/history.py): the print of the request it continues and its own. Read in the order they
were made, per key:

- a request that opens a run (no answer in its history) begins a run; runs that began alike wait for their
  second request, which the latest of them takes (the tracker's choice, so that both agree);
- a request whose own print its key's latest request in some run left already is that request again (a
  retry), in that run;
- a request continues the run whose latest request left the print it continues, if that was less than
  `LINK_SECONDS` before; else it begins a run of its own (`Assembled.orphans`: its run may have begun before
  the records read, which the caller reads further back for).

An inferred run's id is made of its first request's (`inferred_id`): the same run gets the same id whatever
window it is read in, and `chatgate runs show` finds the first request by it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from chatgate.store.runs import RUN_LIMIT, Print, RunHead, RunRecord

LINK_SECONDS = 86_400.0  # a request continues a run whose latest request is at most this old


def inferred_id(ts: float, request_id: str) -> str:
    """An inferred run's id: its first request's time in milliseconds (12 hex digits, so that ids sort by
    when the runs began), then that request's id (20 characters)."""
    return f"{int(ts * 1000):012x}{request_id[:20]}"


def first_of(run_id: str) -> tuple[int, str] | None:
    """(the time in milliseconds, the request id's beginning) of an inferred run's first request, from its
    id or the beginning of it; None: `run_id` is not one `inferred_id` makes (it was named, or the
    tracker's)."""
    if len(run_id) < 12:
        return None
    try:
        ms = int(run_id[:12], 16)
    except ValueError:
        return None
    return ms, run_id[12:]


@dataclass(slots=True)
class Assembled:
    runs: dict[str, RunHead] = field(default_factory=dict)
    orphans: list[RunHead] = field(default_factory=list)  # inferred runs whose first request continues one


def add(head: RunHead, r: RunRecord) -> None:
    """`r` as `head`'s latest request."""
    head.requests_read.append(r)
    head.last_seen = r.ts
    if r.link is not None:
        head.thread = r.link[1]
    head.requests += 1
    if not (r.rule_code or "").startswith(RUN_LIMIT):
        head.turns += 1
    head.cost_picousd += r.cost_picousd
    head.streak = r.repeats
    if r.stopped is not None:
        head.stopped = r.stopped


def assemble(records: Iterable[RunRecord]) -> Assembled:
    """The runs these records make up, each with its requests in order."""
    out = Assembled()
    runs = out.runs
    tips: dict[tuple[str, Print], tuple[RunHead, float]] = {}  # (key, print) -> the run whose latest left it
    waiting: dict[tuple[str, Print], list[RunHead]] = {}  # (key, opening's print) -> runs at their opening
    for r in sorted(records, key=lambda r: (r.ts, r.request_id)):
        named = r.run_id
        if named:
            head = runs.get(named)
            if head is None:
                head = runs[named] = RunHead(named, r.key_id, r.key_name, r.team, r.source, r.ts)
            add(head, r)
            continue
        if r.link is None:
            continue
        after, own = r.link
        key = r.key_id
        if after is None:
            r.retry = False
            head = _begin(runs, r)
            waiting.setdefault((key, own), []).append(head)
            add(head, r)
            continue
        tip = tips.get((key, own))
        r.retry = tip is not None and r.ts - tip[1] <= LINK_SECONDS
        if tip is not None and r.retry:
            head = tip[0]
        else:
            found = tips.get((key, after))
            if found is not None and r.ts - found[1] <= LINK_SECONDS:
                head = found[0]
            elif (alike := waiting.get((key, after))) and r.ts - alike[-1].last_seen <= LINK_SECONDS:
                head = alike.pop()
            else:
                head = _begin(runs, r)
                out.orphans.append(head)
        tips[(key, own)] = (head, r.ts)
        add(head, r)
    return out


def _begin(runs: dict[str, RunHead], r: RunRecord) -> RunHead:
    run_id = inferred_id(r.ts, r.request_id)
    head = runs[run_id] = RunHead(run_id, r.key_id, r.key_name, r.team, "inferred", r.ts)
    return head
