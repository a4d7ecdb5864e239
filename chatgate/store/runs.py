"""Agent runs in the store (issue 52): a run is the usage records of its requests. Each request's record
holds its part in the run (`run_detail`, `DETAIL`), written with the record in the usage writer's one
transaction: a run costs no write of its own, is as durable as the usage it adds up (spooled while the store
is down), and replicas adding to one run never overwrite each other.

A request whose run was named (`x-chatgate-run`, its agent's session) or followed by the tracker (a run with
bounds, chatgate/runs/tracker.py) has the run's id in `run_id`, indexed. Any other's record holds only the
link to the request it continues (`DETAIL`'s `link`), and its run is put together when runs are read
(chatgate/runs/assemble.py, chatgate/runs/reading.py): nothing on the request path but reading the link.
Where replicas share the store, the tracker also writes its print in `run_thread`, indexed, for a replica to
find the run another one saw last. Run ids begin with the time, so that the index on `run_id` grows at its
end (an index on a hash grows at random places, which costs SQLite about 25 µs a row: docs/performance.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

RUN_LIMIT = "run_limit"  # the rule code of a request a run's bound refused

Print = tuple[int, str | int]  # a print of a request's history (chatgate/runs/history.py)


@dataclass(slots=True)  # not frozen: one per request read
class RunRecord:
    """One request of a run, as its usage record metered it."""

    request_id: str
    run_id: str | None  # as stored (None: the run is inferred when read, from `link`)
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
    key_id: str = ""
    key_name: str = ""
    team: str = ""
    link: tuple[Print | None, Print] | None = None  # the print it continues, its own (chatgate/runs/history)


# `run_detail`, a JSON array: what of a RunRecord its usage record does not already hold. `calls`: the names
# of the tool calls of the answer the request carries back (null: it carries none; []: that answer called no
# tool), from which its `tool_calls` and `finish` are read. `link`: [the print it continues (null: none),
# its own], each [position, signature] (null: none was read).
DETAIL = ("source", "retry", "calls", "repeats", "context_window", "stopped", "link", "repairs")


def detail(source: str, retry: bool, calls: tuple[str, ...] | None, repeats: int, window: int,
           stopped: str | None, link: tuple[Print | None, Print] | None, repairs: int) -> str:
    return orjson.dumps((source, retry, calls, repeats, window, stopped, link, repairs)).decode()


@dataclass(slots=True)
class RunHead:
    """A run as its records add up: who, how it was told apart, its first and last request, the bound that
    stopped it, the print of its latest request's history (`thread`), its counters, and its requests in order
    (`requests_read`: only when they were asked for)."""

    run_id: str
    key_id: str
    key_name: str
    team: str
    source: str
    started: float
    last_seen: float = 0.0
    stopped: str | None = None
    thread: Print | None = None  # its latest request's own print
    requests: int = 0
    turns: int = 0  # its requests not refused by a run bound
    cost_picousd: int = 0
    streak: int = 0  # the same tool call in a row, as of its last request
    requests_read: list[RunRecord] = field(default_factory=list)


class RunStore(Protocol):
    def run_records(self, since: float, until: float | None, team: str | None, key_id: str | None,
                    keys: Sequence[str] | None = None) -> list[RunRecord]:
        """The records of requests in runs (named or not) made in [since, until), of `team`, `key_id` and
        (when given) one of `keys`."""

    def named_run(self, run_id: str) -> list[RunRecord]:
        """The records of the run stored under this id, else of the one run stored under an id that starts
        with it ([]: none, or several)."""

    def run_head(self, run_id: str) -> RunHead | None:
        """The counters of the run stored under this id, as its records add up, with its latest request's
        print and repeats; without its requests (a bounded run's, read on its requests' path)."""

    def run_of_thread(self, thread: str) -> RunHead | None:
        """The run whose latest request left this print of its history in `run_thread`, if one did (without
        its requests)."""

    def recent_runs(self, since: float, limit: int) -> list[RunHead]:
        """The runs stored under an id of the latest `limit` such requests since `since`, each as of its
        latest of them: its print, source and repeats (without its requests or counters)."""


class Cursor(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...

    def fetchall(self) -> list[Any]: ...


ROW_COLUMNS = ("run_id", "request_id", "ts", "model", "outcome", "upstream_status", "rule_code",
               "prompt_tokens", "completion_tokens", "prompt_cache_hit_tokens", "prompt_cache_miss_tokens",
               "reasoning_tokens", "cost_picousd", "currency", "attempts", "repairs", "key_id", "key_name",
               "team", "run_thread", "run_detail")
_ROWS = f"SELECT {', '.join(ROW_COLUMNS)} FROM usage"
_CHUNK = 500  # ids per IN (…): below every SQLite's limit on a statement's parameters


def _print(value: Any) -> Print | None:
    if isinstance(value, list) and len(value) == 2 and type(value[0]) is int and type(value[1]) in (str, int):
        return value[0], value[1]
    return None


def _link(value: Any) -> tuple[Print | None, Print] | None:
    if not isinstance(value, list) or len(value) != 2 or (own := _print(value[1])) is None:
        return None
    return (None if value[0] is None else _print(value[0])), own


def record_of(row: Sequence[Any]) -> RunRecord:
    """A usage row (`ROW_COLUMNS`) as a RunRecord."""
    (run_id, request_id, ts, model, outcome, status, rule, prompt, completion, hit, miss, reasoning, cost,
     currency, attempts, _, key_id, key_name, team, _, text) = row
    try:
        values = orjson.loads(text) if text else None
    except orjson.JSONDecodeError:
        values = None
    if not isinstance(values, list) or len(values) != len(DETAIL):
        values = ["inferred", False, None, 0, 0, None, None, 0]
    source, retry, calls, repeats, window, stopped, link, repaired = values
    if not isinstance(calls, list):
        calls, finish = [], None
    else:
        finish = "tool_calls" if calls else "stop"
    tool_calls: dict[str, int] = {}
    if not retry:
        for call in calls:  # (most answers call one tool, or none: a Counter costs more than the rest)
            name = str(call)
            tool_calls[name] = tool_calls.get(name, 0) + 1
    return RunRecord(
        request_id, run_id, float(ts), model, outcome, int(status or (200 if outcome == "ok" else 0)), rule,
        int(prompt), int(completion), int(hit), int(miss), int(reasoning), int(cost), currency or "USD",
        int(window or 0), int(attempts or 1), int(repaired or 0), bool(retry),
        tool_calls, int(repeats or 0), finish, str(source), stopped, key_id, key_name, team, _link(link))


def records_in(cur: Cursor, p: str, since: float, until: float | None, team: str | None,
               key_id: str | None, keys: Sequence[str] | None = None) -> list[RunRecord]:
    where = [f"ts >= {p}", "run_detail IS NOT NULL"]
    params: list[Any] = [since]
    if until is not None:
        where.append(f"ts < {p}")
        params.append(until)
    if team is not None:
        where.append(f"team = {p}")
        params.append(team)
    if key_id is not None:
        where.append(f"key_id = {p}")
        params.append(key_id)
    if keys is None:
        cur.execute(f"{_ROWS} WHERE {' AND '.join(where)}", params)
        return [record_of(row) for row in cur.fetchall()]
    out: list[RunRecord] = []
    keys = list(keys)
    for start in range(0, len(keys), _CHUNK):
        chunk = keys[start:start + _CHUNK]
        cur.execute(f"{_ROWS} WHERE {' AND '.join(where)} AND key_id IN ({', '.join([p] * len(chunk))})",
                    [*params, *chunk])
        out.extend(record_of(row) for row in cur.fetchall())
    return out


def _stored_id(cur: Cursor, p: str, run_id: str) -> str | None:
    """The run id stored as `run_id`, else the one stored id that starts with it."""
    cur.execute(f"SELECT run_id FROM usage WHERE run_id = {p} LIMIT 1", (run_id,))
    found = [row[0] for row in cur.fetchall()]
    if not found:
        cur.execute(f"SELECT DISTINCT run_id FROM usage WHERE run_id IS NOT NULL AND "
                    f"substr(run_id, 1, {len(run_id):d}) = {p} LIMIT 2", (run_id,))
        found = [row[0] for row in cur.fetchall()]
    return found[0] if len(found) == 1 else None


def named_in(cur: Cursor, p: str, run_id: str) -> list[RunRecord]:
    found = _stored_id(cur, p, run_id)
    if found is None:
        return []
    cur.execute(f"{_ROWS} WHERE run_id = {p}", (found,))
    return [record_of(row) for row in cur.fetchall()]


def head_in(cur: Cursor, p: str, run_id: str) -> RunHead | None:
    """The counters of the run stored under `run_id`, added up in the store, with its latest request's
    print and repeats; without its requests."""
    cur.execute(f"SELECT count(*), coalesce(sum(cost_picousd), 0), "
                f"coalesce(sum(CASE WHEN rule_code LIKE {p} THEN 0 ELSE 1 END), 0), min(ts) "
                f"FROM usage WHERE run_id = {p}", (RUN_LIMIT + "%", run_id))
    counted = cur.fetchall()
    if not counted or not counted[0][0]:
        return None
    requests, cost, turns, started = counted[0]
    cur.execute(f"{_ROWS} WHERE run_id = {p} ORDER BY ts DESC, request_id DESC LIMIT 1", (run_id,))
    last = record_of(cur.fetchall()[0])
    return RunHead(run_id, last.key_id, last.key_name, last.team, last.source, float(started), last.ts,
                   last.stopped, last.link[1] if last.link else None, int(requests), int(turns), int(cost),
                   last.repeats)


def recent_in(cur: Cursor, p: str, since: float, limit: int) -> list[RunHead]:
    cur.execute(f"{_ROWS} WHERE ts >= {p} AND run_id IS NOT NULL ORDER BY ts DESC LIMIT {int(limit)}",
                (since,))
    latest: dict[str, RunHead] = {}
    for row in cur.fetchall():
        r = record_of(row)
        if r.run_id is not None and r.run_id not in latest:
            latest[r.run_id] = RunHead(r.run_id, r.key_id, r.key_name, r.team, r.source, r.ts, r.ts,
                                       r.stopped, r.link[1] if r.link else None, streak=r.repeats)
    return list(latest.values())


def thread_in(cur: Cursor, p: str, thread: str) -> RunHead | None:
    cur.execute(f"SELECT run_id FROM usage WHERE run_thread = {p} ORDER BY ts DESC LIMIT 1", (thread,))
    rows = cur.fetchall()
    return head_in(cur, p, rows[0][0]) if rows else None
