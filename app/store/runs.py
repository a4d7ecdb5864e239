"""Agent runs in the store (issue 52): one `runs` row per run (who, how it was told apart, when it began,
what stopped it) and one `run_requests` row per request of a run. A run's counters are summed from its
requests when read, so replicas adding requests to one run never overwrite each other."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(slots=True)  # not frozen: one per run (a frozen __init__ pays a call per field)
class RunHead:
    run_id: str
    key_id: str
    key_name: str
    team: str
    source: str  # header, session, or inferred
    started: float
    stopped: str | None = None  # the bound that stopped it (run_max_turns, run_max_cost, run_max_repeats)


@dataclass(slots=True)  # not frozen: one per request
class RunRequest:
    """One request of a run, as its usage record metered it."""

    request_id: str
    run_id: str
    ts: float
    thread: str | None  # the history's print a later request continuing it looks up (inferred runs)
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
    tool_calls: str  # JSON: the tool calls of the answer this request carries back, {name: count}
    repeats: int  # how many times in a row the run's model has made the same tool call, as of this request
    finish: str | None  # why the answer this request carries back ended (tool_calls, stop), when it shows


RUN_COLUMNS = ("run_id", "key_id", "key_name", "team", "source", "started", "stopped")
REQUEST_COLUMNS = tuple(RunRequest.__slots__)


class RunStore(Protocol):
    def save_runs(self, heads: Sequence[RunHead], requests: Sequence[RunRequest]) -> None:
        """Add runs (a known run keeps its row; a stop is kept once set) and their requests (idempotent)."""

    def find_runs(self, team: str | None, key_id: str | None, since: float, limit: int) -> list[RunHead]:
        """The runs with a request since `since`, the latest begun first."""

    def run_requests(self, run_ids: Sequence[str]) -> list[RunRequest]:
        """Their requests, in order."""

    def run_head(self, run_id: str) -> RunHead | None:
        """The run of this id, else the one run whose id starts with it (None: none, or several)."""

    def run_of_thread(self, thread: str) -> str | None:
        """The run whose request left this print of its history, if one did."""


class Cursor(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...

    def executemany(self, sql: str, params: Sequence[Sequence[Any]]) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def fetchone(self) -> Any: ...


def save_in(cur: Cursor, p: str, heads: Sequence[RunHead], requests: Sequence[RunRequest]) -> None:
    if heads:
        cur.executemany(
            f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}) VALUES ({', '.join([p] * len(RUN_COLUMNS))}) "
            "ON CONFLICT (run_id) DO UPDATE SET stopped = coalesce(runs.stopped, excluded.stopped)",
            [tuple(getattr(h, c) for c in RUN_COLUMNS) for h in heads])
    if requests:
        cur.executemany(
            f"INSERT INTO run_requests ({', '.join(REQUEST_COLUMNS)}) "
            f"VALUES ({', '.join([p] * len(REQUEST_COLUMNS))}) ON CONFLICT (request_id) DO NOTHING",
            [tuple(getattr(r, c) for c in REQUEST_COLUMNS) for r in requests])


def find_in(cur: Cursor, p: str, team: str | None, key_id: str | None, since: float, limit: int
            ) -> list[RunHead]:
    where = [f"run_id IN (SELECT run_id FROM run_requests WHERE ts >= {p})"]
    params: list[Any] = [since]
    if team is not None:
        where.append(f"team = {p}")
        params.append(team)
    if key_id is not None:
        where.append(f"key_id = {p}")
        params.append(key_id)
    cur.execute(f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE {' AND '.join(where)} "
                f"ORDER BY started DESC, run_id LIMIT {int(limit)}", params)
    return [RunHead(r[0], r[1], r[2], r[3], r[4], float(r[5]), r[6]) for r in cur.fetchall()]


def requests_in(cur: Cursor, p: str, run_ids: Sequence[str]) -> list[RunRequest]:
    out: list[RunRequest] = []
    for start in range(0, len(run_ids), 500):
        chunk = list(run_ids[start:start + 500])
        cur.execute(f"SELECT {', '.join(REQUEST_COLUMNS)} FROM run_requests WHERE run_id IN "
                    f"({', '.join([p] * len(chunk))}) ORDER BY ts, request_id", chunk)
        out.extend(_request(row) for row in cur.fetchall())
    out.sort(key=lambda r: (r.ts, r.request_id))
    return out


def head_in(cur: Cursor, p: str, run_id: str) -> RunHead | None:
    columns = ", ".join(RUN_COLUMNS)
    cur.execute(f"SELECT {columns} FROM runs WHERE run_id = {p}", (run_id,))
    rows = cur.fetchall()
    if not rows:
        cur.execute(f"SELECT {columns} FROM runs WHERE substr(run_id, 1, {len(run_id):d}) = {p} LIMIT 2",
                    (run_id,))
        rows = cur.fetchall()
    if len(rows) != 1:
        return None
    r = rows[0]
    return RunHead(r[0], r[1], r[2], r[3], r[4], float(r[5]), r[6])


def thread_in(cur: Cursor, p: str, thread: str) -> str | None:
    cur.execute(f"SELECT run_id FROM run_requests WHERE thread = {p} ORDER BY ts DESC LIMIT 1", (thread,))
    row = cur.fetchone()
    return None if row is None else str(row[0])


def _request(row: Sequence[Any]) -> RunRequest:
    (request_id, run_id, ts, thread, model, outcome, status, rule_code, prompt, completion, hit, miss,
     reasoning, cost, currency, window, attempts, repairs, retry, tool_calls, repeats, finish) = row
    return RunRequest(request_id, run_id, float(ts), thread, model, outcome, int(status), rule_code,
                      int(prompt), int(completion), int(hit), int(miss), int(reasoning), int(cost), currency,
                      int(window), int(attempts), int(repairs), bool(retry), tool_calls, int(repeats), finish)
