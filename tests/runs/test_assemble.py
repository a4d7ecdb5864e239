"""Runs put together from records when they are read (chatgate/runs/assemble.py, chatgate/runs/reading.py),
as pure functions of the records: loops that began alike, retries, named runs, the link's age, and the same
run under the same id whatever period it is read in."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chatgate.runs.assemble import LINK_SECONDS, assemble, first_of, inferred_id
from chatgate.runs.history import link
from chatgate.runs.reading import DAY, find, one
from chatgate.store.runs import RunHead, RunRecord

TASK = [{"role": "user", "content": "Fix the failing test"}]


def call(run: int, n: int) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{run}_{n}", "type": "function", "function": {"name": "grep", "arguments": "{}"}}]}


def loop(run: int, rounds: int) -> list[list[dict[str, Any]]]:
    """The histories of a tool loop's requests: the task, then each round's call and result."""
    items: list[dict[str, Any]] = list(TASK)
    out = [list(items)]
    for n in range(1, rounds):
        items += [call(run, n), {"role": "tool", "tool_call_id": f"call_{run}_{n}", "content": "ok"}]
        out.append(list(items))
    return out


def record(items: list[dict[str, Any]], ts: float, request_id: str, key: str = "fp-1",
           run_id: str | None = None, outcome: str = "ok") -> RunRecord:
    read = link("chat", items, True)
    assert read is not None
    return RunRecord(request_id, run_id, ts, "deepseek-v4-flash", outcome, 200, None, 10 * len(items), 5, 0,
                     10 * len(items), 0, 100, "USD", 0, 1, 0, False, {}, 0, None, "header" if run_id else
                     "inferred", key_id=key, link=(read[0], read[1]))


def ids(heads: Sequence[RunHead]) -> list[list[str]]:
    return sorted([r.request_id for r in h.requests_read] for h in heads)


def test_three_loops_that_began_alike_are_three_runs_and_a_retry_stays_in_its_run() -> None:
    loops = [loop(run, 4) for run in range(3)]
    records = []
    for n in range(4):  # round by round, the three loops' requests interleaved
        records += [record(loops[run][n], 100 + 10 * n + run, f"r{run}{n}") for run in range(3)]
    records.append(record(loops[1][2], 125, "again"))  # loop 1's third request, sent again
    found = assemble(records)
    runs = ids(list(found.runs.values()))
    # the openings are the same words: which loop's opening each run begins with cannot be told (the
    # latest still waiting is taken), the rest of each loop can
    assert sorted(r[1:] for r in runs) == [["r01", "r02", "r03"], ["r11", "r12", "again", "r13"],
                                           ["r21", "r22", "r23"]]
    assert sorted(r[0] for r in runs) == ["r00", "r10", "r20"]
    assert [r.retry for h in found.runs.values() for r in h.requests_read].count(True) == 1
    assert not found.orphans
    for head in found.runs.values():
        first = head.requests_read[0]
        assert head.run_id == inferred_id(first.ts, first.request_id)
        assert first_of(head.run_id) == (int(first.ts * 1000), first.request_id)


def test_named_records_are_their_run_and_other_keys_never_continue_a_run() -> None:
    steps = loop(0, 3)
    records = [record(steps[0], 1, "a0", run_id="task-a"), record(steps[1], 2, "a1", run_id="task-a"),
               record(steps[0], 3, "b0"), record(steps[1], 4, "b1", key="fp-2")]
    found = assemble(records)
    assert sorted((h.run_id[:6], h.requests) for h in found.runs.values()) == [
        (inferred_id(3, "b0")[:6], 1), (inferred_id(4, "b1")[:6], 1), ("task-a", 2)]
    assert [h.requests_read[0].request_id for h in found.orphans] == ["b1"]


def test_a_request_more_than_a_day_after_its_run_begins_a_run_of_its_own() -> None:
    steps = loop(0, 3)
    found = assemble([record(steps[0], 0, "r0"), record(steps[1], 10, "r1"),
                      record(steps[2], 10 + LINK_SECONDS + 1, "late")])
    assert ids(list(found.runs.values())) == [["late"], ["r0", "r1"]]


class Records:
    """A store's `run_records` and `named_run` over a list (chatgate/store/runs.py's queries)."""

    def __init__(self, records: list[RunRecord]) -> None:
        self.records = records

    def run_records(self, since: float, until: float | None, team: str | None, key_id: str | None,
                    keys: Sequence[str] | None = None) -> list[RunRecord]:
        return [_copy(r) for r in self.records if since <= r.ts and (until is None or r.ts < until)
                and (key_id is None or r.key_id == key_id) and (keys is None or r.key_id in keys)]

    def named_run(self, run_id: str) -> list[RunRecord]:
        return [_copy(r) for r in self.records if r.run_id == run_id]


def _copy(r: RunRecord) -> RunRecord:
    return RunRecord(*(getattr(r, f) for f in RunRecord.__slots__))  # type: ignore[attr-defined]


def test_a_run_begun_days_before_the_period_is_listed_whole_under_its_one_id() -> None:
    steps = loop(0, 6)
    now = 10 * DAY
    # a request every 20 hours: the run began four days before the period's last day
    records = [record(items, now - (5 - n) * 20 * 3600, f"r{n}") for n, items in enumerate(steps)]
    store = Records(records)
    whole = find(store, None, None, 0.0, 10)  # type: ignore[arg-type]
    last_day = find(store, None, None, now - DAY, 10)  # type: ignore[arg-type]
    assert [h.requests for h in whole] == [6] and [h.requests for h in last_day] == [6]
    assert whole[0].run_id == last_day[0].run_id == inferred_id(records[0].ts, "r0")
    for beginning in (whole[0].run_id, whole[0].run_id[:16], whole[0].run_id[:8]):
        shown = one(store, beginning)  # type: ignore[arg-type]
        assert shown is not None and shown.run_id == whole[0].run_id
        assert [r.request_id for r in shown.requests_read] == [f"r{n}" for n in range(6)]
    assert one(store, whole[0].run_id[:4]) is None  # type: ignore[arg-type]
    assert one(store, "no-such-run") is None  # type: ignore[arg-type]


def test_the_latest_runs_are_read_from_the_end_of_the_period() -> None:
    now = 100 * DAY
    records = []
    for run in range(6):  # a run begun every 5 hours, each of 3 requests a minute apart
        for n, items in enumerate(loop(run, 3)):
            records.append(record(items, now - (5 - run) * 5 * 3600 + 60 * n, f"r{run}{n}"))
    store = Records(records)
    read: list[tuple[float, float | None]] = []
    reading = store.run_records

    def counted(since: float, until: float | None, team: str | None, key_id: str | None,
                keys: Sequence[str] | None = None) -> list[RunRecord]:
        read.append((since, until))
        return reading(since, until, team, key_id, keys)

    store.run_records = counted  # type: ignore[method-assign]
    latest = find(store, None, None, now - 30 * DAY, 2, until=now + 600)  # type: ignore[arg-type]
    assert [h.requests_read[0].request_id for h in latest] == ["r50", "r40"]
    assert min(since for since, _ in read) > now - 2 * DAY  # not the month
    everything = find(store, None, None, now - 30 * DAY, 10, until=now + 600)  # type: ignore[arg-type]
    assert [h.requests for h in everything] == [3] * 6
