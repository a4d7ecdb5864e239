"""Agent runs in the store (issue 52): a run is the usage records that carry its id. Each request's record
holds its run (`run_id`) and its part in the run (`run_detail`, `DETAIL`: with the print of its history, how
the run's next request finds it after a restart), written with the record in the usage writer's one
transaction: a run costs no write of its own, is as durable as the usage it adds up (spooled while the
store is down), and replicas adding to one run never overwrite each other. A run's line is read by adding
up its records (chatgate/runs/summary.py).

Where replicas share the store, the print is also in `run_thread`, indexed, for a replica to find the run
another one saw last. A single process does not write it: it loads the recent prints when it starts
(`recent_runs`), and an index on a hash grows at random places, which made each record cost SQLite about
25 µs more to write (docs/performance.md). Run ids chatgate makes begin with the time (`ids.ordered_id`),
so that the index on `run_id` grows at its end."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

RUN_LIMIT = "run_limit"  # the rule code of a request a run's bound refused


@dataclass(slots=True)  # not frozen: one per request read
class RunRecord:
    """One request of a run, as its usage record metered it."""

    request_id: str
    run_id: str
    ts: float
    model: str
    outcome: str
    status: int
    rule_code: str | None
    prompt_tokens: int
    completion_tokens: int
    prompt_cache_hit_tokens: int
    prompt_cache_miss_tokens: int
    reasoning_tokens: int
    cost_picousd: int
    currency: str
    context_window: int  # the model's, in tokens (0: unknown)
    attempts: int
    repairs: int
    retry: bool  # the same history as the run's request before it, sent again
    tool_calls: dict[str, int]  # the tool calls of the answer this request carries back, by name
    repeats: int  # how many times in a row the run's model has made the same tool call, as of this request
    finish: str | None  # why the answer this request carries back ended (tool_calls, stop), when it shows
    source: str = "inferred"  # how the run was told apart: header, session, inferred
    stopped: str | None = None  # the bound that refused it (run_max_turns, run_max_cost_usd, run_max_repeats)
    thread: str | None = None  # the print of its history


# `run_detail`, a JSON array: what of a RunRecord its usage record does not already hold. `calls`: the names
# of the tool calls of the answer the request carries back (null: it carries none; []: that answer called no
# tool), from which its `tool_calls` and `finish` are read.
DETAIL = ("source", "retry", "calls", "repeats", "context_window", "stopped", "thread", "repairs")


def detail(source: str, retry: bool, calls: tuple[str, ...] | None, repeats: int, window: int,
           stopped: str | None, thread: str | None, repairs: int) -> str:
    return orjson.dumps((source, retry, calls, repeats, window, stopped, thread, repairs)).decode()


@dataclass(slots=True)
class RunHead:
    """A run as its records add up: who, how it was told apart, its first and last request, the bound that
    stopped it, the print of its last request's history (`thread`), its counters, and its requests in order
    (`requests_read`: only when they were asked for)."""

    run_id: str
    key_id: str
    key_name: str
    team: str
    source: str
    started: float
    last_seen: float = 0.0
    stopped: str | None = None
    thread: str | None = None
    requests: int = 0
    turns: int = 0  # its requests not refused by a run bound
    cost_picousd: int = 0
    streak: int = 0  # the same tool call in a row, as of its last request
    requests_read: list[RunRecord] = field(default_factory=list)


class RunStore(Protocol):
    def find_runs(self, team: str | None, key_id: str | None, since: float, limit: int) -> list[RunHead]:
        """The runs with a request since `since`, the latest begun first, with their requests."""

    def run_head(self, run_id: str, rounds: bool = True) -> RunHead | None:
        """The run of this id, else the one run whose id starts with it (None: none, or several); its
        requests only when asked (`rounds`)."""

    def run_of_thread(self, thread: str) -> RunHead | None:
        """The run whose latest request left this print of its history in `run_thread`, if one did (without
        its requests)."""

    def recent_runs(self, since: float, limit: int) -> list[RunHead]:
        """The runs of the latest `limit` requests in runs since `since`, each as of its latest of them: its
        print, source and repeats (without its requests or counters)."""


class Cursor(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...

    def fetchall(self) -> list[Any]: ...


ROW_COLUMNS = ("run_id", "request_id", "ts", "model", "outcome", "upstream_status", "rule_code",
               "prompt_tokens", "completion_tokens", "prompt_cache_hit_tokens", "prompt_cache_miss_tokens",
               "reasoning_tokens", "cost_picousd", "currency", "attempts", "repairs", "key_id", "key_name",
               "team", "run_thread", "run_detail")
_ROWS = f"SELECT {', '.join(ROW_COLUMNS)} FROM usage"
_CHUNK = 500  # ids per IN (…): below every SQLite's limit on a statement's parameters


def _request(row: Sequence[Any]) -> tuple[RunRecord, str, str, str, str | None]:
    """A record's row as a RunRecord, with its key id, key name, team and print."""
    (run_id, request_id, ts, model, outcome, status, rule, prompt, completion, hit, miss, reasoning, cost,
     currency, attempts, _, key_id, key_name, team, thread, text) = row
    try:
        values = orjson.loads(text) if text else None
    except orjson.JSONDecodeError:
        values = None
    if not isinstance(values, list) or len(values) != len(DETAIL):
        values = ["inferred", False, None, 0, 0, None, None, 0]
    source, retry, calls, repeats, window, stopped, own, repaired = values
    if not isinstance(calls, list):
        calls, finish = [], None
    else:
        finish = "tool_calls" if calls else "stop"
    tool_calls = {} if retry else dict(Counter(str(c) for c in calls))
    request = RunRecord(
        request_id, run_id, float(ts), model, outcome, int(status or (200 if outcome == "ok" else 0)), rule,
        int(prompt), int(completion), int(hit), int(miss), int(reasoning), int(cost), currency or "USD",
        int(window or 0), int(attempts or 1), int(repaired or 0), bool(retry),
        tool_calls, int(repeats or 0), finish, str(source), stopped,
        thread or own)
    return request, key_id, key_name, team, thread or own


def _heads(rows: list[Any]) -> dict[str, RunHead]:
    """The runs these records make up, each with its requests in order."""
    parsed = sorted((_request(row) for row in rows), key=lambda r: (r[0].ts, r[0].request_id))
    heads: dict[str, RunHead] = {}
    for request, key_id, key_name, team, thread in parsed:
        head = heads.get(request.run_id)
        if head is None:
            head = heads[request.run_id] = RunHead(request.run_id, key_id, key_name, team, request.source,
                                                   request.ts)
        head.requests_read.append(request)
        head.last_seen = request.ts
        head.thread = thread or head.thread
        head.requests += 1
        if not (request.rule_code or "").startswith(RUN_LIMIT):
            head.turns += 1
        head.cost_picousd += request.cost_picousd
        head.streak = request.repeats
        if request.stopped is not None:
            head.stopped = request.stopped
    return heads


def _read(cur: Cursor, p: str, run_ids: Sequence[str]) -> dict[str, RunHead]:
    rows: list[Any] = []
    for start in range(0, len(run_ids), _CHUNK):
        chunk = run_ids[start:start + _CHUNK]
        cur.execute(f"{_ROWS} WHERE run_id IN ({', '.join([p] * len(chunk))})", chunk)
        rows.extend(cur.fetchall())
    return _heads(rows)


def find_in(cur: Cursor, p: str, team: str | None, key_id: str | None, since: float, limit: int
            ) -> list[RunHead]:
    where = [f"ts >= {p}", "run_id IS NOT NULL"]
    params: list[Any] = [since]
    if team is not None:
        where.append(f"team = {p}")
        params.append(team)
    if key_id is not None:
        where.append(f"key_id = {p}")
        params.append(key_id)
    cur.execute(f"SELECT run_id, min(ts) AS started FROM usage WHERE run_id IN "
                f"(SELECT run_id FROM usage WHERE {' AND '.join(where)}) "
                f"GROUP BY run_id ORDER BY started DESC, run_id LIMIT {int(limit)}", params)
    ids = [row[0] for row in cur.fetchall()]
    heads = _read(cur, p, ids)
    return [heads[i] for i in ids if i in heads]


def head_in(cur: Cursor, p: str, run_id: str, rounds: bool = True) -> RunHead | None:
    cur.execute(f"SELECT run_id FROM usage WHERE run_id = {p} LIMIT 1", (run_id,))
    found = [row[0] for row in cur.fetchall()]
    if not found:
        cur.execute(f"SELECT DISTINCT run_id FROM usage WHERE run_id IS NOT NULL AND "
                    f"substr(run_id, 1, {len(run_id):d}) = {p} LIMIT 2", (run_id,))
        found = [row[0] for row in cur.fetchall()]
    if len(found) != 1:
        return None
    if rounds:
        return _read(cur, p, found).get(found[0])
    return _counters(cur, p, found[0])


def _counters(cur: Cursor, p: str, run_id: str) -> RunHead | None:
    """The run's counters, added up in the store (a bounded run's, read on its requests' path), with its
    latest request's print and repeats; without its requests."""
    cur.execute(f"SELECT count(*), coalesce(sum(cost_picousd), 0), "
                f"coalesce(sum(CASE WHEN rule_code LIKE {p} THEN 0 ELSE 1 END), 0), min(ts) "
                f"FROM usage WHERE run_id = {p}", (RUN_LIMIT + "%", run_id))
    counted = cur.fetchall()
    if not counted or not counted[0][0]:
        return None
    requests, cost, turns, started = counted[0]
    cur.execute(f"{_ROWS} WHERE run_id = {p} ORDER BY ts DESC, request_id DESC LIMIT 1", (run_id,))
    last, key_id, key_name, team, thread = _request(cur.fetchall()[0])
    return RunHead(run_id, key_id, key_name, team, last.source, float(started), last.ts, last.stopped, thread,
                   int(requests), int(turns), int(cost), last.repeats)


def recent_in(cur: Cursor, p: str, since: float, limit: int) -> list[RunHead]:
    cur.execute(f"{_ROWS} WHERE ts >= {p} AND run_id IS NOT NULL ORDER BY ts DESC LIMIT {int(limit)}",
                (since,))
    latest: dict[str, RunHead] = {}
    for row in cur.fetchall():
        r, key_id, key_name, team, thread = _request(row)
        if r.run_id not in latest:
            latest[r.run_id] = RunHead(r.run_id, key_id, key_name, team, r.source, r.ts, r.ts, r.stopped,
                                       thread, streak=r.repeats)
    return list(latest.values())


def thread_in(cur: Cursor, p: str, thread: str) -> RunHead | None:
    cur.execute(f"SELECT run_id FROM usage WHERE run_thread = {p} ORDER BY ts DESC LIMIT 1", (thread,))
    rows = cur.fetchall()
    return _counters(cur, p, rows[0][0]) if rows else None
