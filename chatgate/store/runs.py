"""Agent runs in the store (issue 52): one `runs` row per run, written as additive updates (a replica adds
its requests' counters), so that replicas adding requests to one run never overwrite each other; and the
run's requests in `run_rounds`, one row per run per batch of its requests (never rewritten)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson


@dataclass(slots=True)  # not frozen: one per run (a frozen __init__ pays a call per field)
class RunHead:
    """A run as the store has it: who, how it was told apart (header, session, inferred), its first and
    last request, what stopped it, the print of its last request's history (`thread`), its counters and
    its requests (`rounds`: one JSON array a line, `ROUND_FIELDS`)."""

    run_id: str
    key_id: str
    key_name: str
    team: str
    source: str
    started: float
    last_seen: float = 0.0
    stopped: str | None = None  # the bound that stopped it (run_max_turns, run_max_cost_usd, run_max_repeats)
    thread: str | None = None
    requests: int = 0
    turns: int = 0  # its requests not refused by a run bound
    cost_picousd: int = 0
    streak: int = 0  # the same tool call in a row, as of its last request
    rounds: str = ""


@dataclass(slots=True)  # not frozen: one per request
class RunRequest:
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


ROUND_FIELDS = tuple(f for f in RunRequest.__slots__ if f != "run_id")
HEAD_COLUMNS = ("run_id", "key_id", "key_name", "team", "source", "started", "last_seen", "stopped", "thread",
                "requests", "turns", "cost_picousd", "streak")


class RunStore(Protocol):
    def save_runs(self, updates: Sequence[RunHead]) -> None:
        """Add to each run (made by its first update): its counters are added, its rounds appended, its
        last request and its print kept when they are the latest, a stop kept once set."""

    def find_runs(self, team: str | None, key_id: str | None, since: float, limit: int) -> list[RunHead]:
        """The runs with a request since `since`, the latest begun first."""

    def run_head(self, run_id: str, rounds: bool = True) -> RunHead | None:
        """The run of this id, else the one run whose id starts with it (None: none, or several); its
        `rounds` only when asked."""

    def run_of_thread(self, thread: str) -> RunHead | None:
        """The run whose last request left this print of its history, if one did."""


class Cursor(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...

    def executemany(self, sql: str, params: Sequence[Sequence[Any]]) -> Any: ...

    def fetchall(self) -> list[Any]: ...


def _newer(column: str) -> str:
    return f"CASE WHEN excluded.last_seen >= runs.last_seen THEN excluded.{column} ELSE runs.{column} END"


def save_in(cur: Cursor, p: str, updates: Sequence[RunHead]) -> None:
    if updates:
        cur.executemany(
            f"INSERT INTO runs ({', '.join(HEAD_COLUMNS)}) VALUES ({', '.join([p] * len(HEAD_COLUMNS))}) "
            f"ON CONFLICT (run_id) DO UPDATE SET last_seen = {_newer('last_seen')}, "
            f"thread = {_newer('thread')}, streak = {_newer('streak')}, "
            "stopped = coalesce(excluded.stopped, runs.stopped), "
            "requests = runs.requests + excluded.requests, turns = runs.turns + excluded.turns, "
            "cost_picousd = runs.cost_picousd + excluded.cost_picousd",
            [tuple(getattr(u, c) for c in HEAD_COLUMNS) for u in updates])
        cur.executemany(f"INSERT INTO run_rounds (run_id, ts, rounds) VALUES ({p}, {p}, {p})",
                        [(u.run_id, u.last_seen, u.rounds) for u in updates if u.rounds])


def _heads(cur: Cursor, p: str, rounds: bool = True) -> list[RunHead]:
    """The selected runs, with their `rounds` (`rounds`: read them too)."""
    heads = [RunHead(r[0], r[1], r[2], r[3], r[4], float(r[5]), float(r[6]), r[7], r[8], int(r[9]),
                     int(r[10]), int(r[11]), int(r[12])) for r in cur.fetchall()]
    if not rounds or not heads:
        return heads
    by_id = {h.run_id: h for h in heads}
    parts: dict[str, list[str]] = {h.run_id: [] for h in heads}
    ids = list(by_id)
    for start in range(0, len(ids), 500):
        chunk = ids[start:start + 500]
        cur.execute(f"SELECT run_id, rounds FROM run_rounds WHERE run_id IN ({', '.join([p] * len(chunk))}) "
                    "ORDER BY ts", chunk)
        for run_id, text in cur.fetchall():
            parts[run_id].append(text)
    for run_id, texts in parts.items():
        by_id[run_id].rounds = "".join(texts)
    return heads


def find_in(cur: Cursor, p: str, team: str | None, key_id: str | None, since: float, limit: int
            ) -> list[RunHead]:
    where = [f"last_seen >= {p}"]
    params: list[Any] = [since]
    if team is not None:
        where.append(f"team = {p}")
        params.append(team)
    if key_id is not None:
        where.append(f"key_id = {p}")
        params.append(key_id)
    cur.execute(f"SELECT {', '.join(HEAD_COLUMNS)} FROM runs WHERE {' AND '.join(where)} "
                f"ORDER BY started DESC, run_id LIMIT {int(limit)}", params)
    return _heads(cur, p)


def head_in(cur: Cursor, p: str, run_id: str, rounds: bool = True) -> RunHead | None:
    columns = ", ".join(HEAD_COLUMNS)
    cur.execute(f"SELECT {columns} FROM runs WHERE run_id = {p}", (run_id,))
    rows = _heads(cur, p, rounds)
    if not rows:
        cur.execute(f"SELECT {columns} FROM runs WHERE substr(run_id, 1, {len(run_id):d}) = {p} LIMIT 2",
                    (run_id,))
        rows = _heads(cur, p, rounds)
    return rows[0] if len(rows) == 1 else None


def thread_in(cur: Cursor, p: str, thread: str) -> RunHead | None:
    columns = ", ".join(HEAD_COLUMNS)
    cur.execute(f"SELECT {columns} FROM runs WHERE thread = {p} ORDER BY last_seen DESC LIMIT 1", (thread,))
    rows = _heads(cur, p, rounds=False)
    return rows[0] if rows else None


def round_line(r: RunRequest) -> bytes:
    return orjson.dumps([getattr(r, f) for f in ROUND_FIELDS], option=orjson.OPT_APPEND_NEWLINE)


def requests_of(head: RunHead) -> list[RunRequest]:
    """The run's requests, in order, from its `rounds`."""
    out = []
    for line in head.rounds.splitlines():
        try:
            values = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(values, list) and len(values) == len(ROUND_FIELDS):
            out.append(RunRequest(values[0], head.run_id, *values[1:]))
    out.sort(key=lambda r: (r.ts, r.request_id))
    return out
