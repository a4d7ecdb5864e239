"""Scenario 13 (issue 15): the cost of limits (budgets, rpm, tpm, concurrency).

Limits are set per passthrough caller, the key `fp-` + sha256(secret)[:12] (chatgate/gateway/auth.py), with
`chatgate keys set` (the store API when the CLI cannot). They are high enough never to refuse, so every kind
is checked, counted and settled on every request: budget $1,000,000 a month, rpm 10,000,000, tpm 10^12,
max_concurrent 10,000. Only key limits: team `default` limits would also apply to the unlimited caller of
the two-replica part.

Single replica: twins on SQLite (rates and concurrency counted in process, budgets "auto" = local):
chatgate-limits has the limits row for the bench key, chatgate-nolimits has none. wrk at c=16 on each, side
by side (bench/measure.py `side_by_side`: both loaded at once, both pinned to one CPU).

Two replicas on PostgreSQL (a fresh database per run, dropped after) and Redis (db 7, flushed before and
after), budgets in the store (CHATGATE_LIMITS_BUDGETS=store): the same two processes serve a limited key
and an unlimited one, so "limits off" runs on the very same replicas, pools and warm-up, only without the
rows. c=1 latency with wrk, the four (replica, key) pairs in rotated order every round.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from bench.common import VENV_BIN, request_once, warm_up
from bench.measure import Context, alternating, round_ratios, side_by_side, spread, wrk_measure, wrk_sample
from bench.report import Column, ScenarioResult
from bench.stats import median
from bench.targets import Cluster, Target, TargetSpec, UpstreamSpec

ON, OFF = "chatgate-limits", "chatgate-nolimits"
REPLICAS = ("chatgate-pg-a", "chatgate-pg-b")
SECRET = "sk-bench"  # wrk's and the warm-up's key
LIMITED, FREE = "sk-bench-limited", "sk-bench-free"
BUDGET_USD, RPM, TPM, MAX_CONCURRENT = 1_000_000, 10_000_000, 10**12, 10_000
PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
PG_BASE = "postgresql://postgres@127.0.0.1:5432/"
REDIS_URL = "redis://127.0.0.1:6379/7"
PAIR_FACTOR = 3
RATIO = 0.9
ADDED_MS = 1.0


def fingerprint(secret: str) -> str:
    """chatgate/gateway/auth.py fingerprint(): how a passthrough caller is named (and limited)."""
    return "fp-" + hashlib.sha256(secret.encode()).hexdigest()[:12]


def set_key_limits(store_url: str, secret: str) -> str:
    """Give the caller with this secret the bench limits in the store; returns how it was done."""
    fp = fingerprint(secret)
    argv = [str(VENV_BIN / "chatgate"), "keys", "set", fp, "--budget-usd", str(BUDGET_USD)]
    argv += ["--budget-period", "month", "--rpm", str(RPM), "--tpm", str(TPM)]
    argv += ["--max-concurrent", str(MAX_CONCURRENT), "--store", store_url]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATGATE_")}
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)
        if out.returncode == 0:
            return f"`chatgate keys set {fp} …`: {out.stdout.strip()[-200:]}"
        why = f"`chatgate keys set` exited {out.returncode}: {(out.stderr or out.stdout).strip()[-200:]}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = f"`chatgate keys set` failed: {exc}"
    from chatgate.store import open_store
    from chatgate.store.base import LimitRow

    store = open_store(store_url)
    try:
        store.migrate()
        store.set_limits(
            LimitRow(
                "key",
                fp,
                budget_picousd=BUDGET_USD * 10**12,
                budget_period="month",
                rpm=RPM,
                tpm=TPM,
                max_concurrent=MAX_CONCURRENT,
            )
        )
    finally:
        store.close()
    return f"the store API (Store.set_limits), because {why}"


def limit_header(port: int, body: bytes, secret: str) -> str | None:
    """x-ratelimit-limit-requests of one answer (None: no limits applied), or raises on a non-200."""
    status, headers, raw = request_once(port, body=body, authorization=f"Bearer {secret}")
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {raw[:200]!r}")
    return headers.get("x-ratelimit-limit-requests")


def _rounds(ctx: Context) -> int:
    return 1 if ctx.settings.quick else ctx.settings.reps * PAIR_FACTOR


def limits(ctx: Context) -> ScenarioResult:
    res = ScenarioResult(
        "13",
        "limits: one replica with vs without (c=16), two replicas on PostgreSQL + Redis limited vs not (c=1)",
        [
            Column("c16_rps", "c=16 req/s", "{:.0f}"),
            Column("c16_ratio", "x no limits", "{:.3f}"),
            Column("c16s_rps", "c=16 stream req/s", "{:.0f}"),
            Column("c16s_ratio", "x no limits", "{:.3f}"),
            Column("c1_rps", "c=1 req/s", "{:.0f}"),
            Column("c1_p50_ms", "c=1 p50 ms", "{:.3f}"),
            Column("c1_p99_ms", "c=1 p99 ms", "{:.3f}"),
            Column("c1_added_ms", "added p50 ms", "{:.3f}"),
        ],
    )
    for label, part in (("one replica", _single), ("two replicas on PostgreSQL + Redis", _replicas)):
        ctx.log(f"  scenario 13: {label}")
        try:
            part(ctx, res)
        except Exception as exc:  # report it, go on with the other part
            res.notes.append(f"{label} FAILED: {type(exc).__name__}: {exc}"[:600])
            res.check(f"{label} ran", False, "no", "yes", f"{type(exc).__name__}: {exc}"[:300])
            ctx.log(f"    {label} FAILED: {type(exc).__name__}: {exc}")
    res.notes.append(
        f"limits per key: budget ${BUDGET_USD:,}/month, rpm {RPM:,}, tpm {TPM:,}, max_concurrent "
        f"{MAX_CONCURRENT:,} (never reached: every kind is checked and settled on every request); "
        f"{_rounds(ctx)} round(s) per measurement, the order rotated every round; a ratio or an added p50 is "
        "the median of the per-round figures"
    )
    return res


# --- one replica ---------------------------------------------------------------------------------------


def _single(ctx: Context, res: ScenarioResult) -> None:
    s = ctx.settings
    checks = [("c16_", "limits / no limits req/s at c=16, one replica")]
    checks.append(("c16s_", "limits / no limits req/s at c=16 streaming, one replica"))
    refused = "requests refused or failed with limits on, one replica (wrk non-2xx, errors)"
    db = ctx.workdir / f"{ON}.db"
    with contextlib.suppress(FileNotFoundError):
        db.unlink()
    if ctx.chatgate_problem:
        for _, name in checks:
            res.skip(name, f"≥ {RATIO:g}", ctx.chatgate_problem)
        return
    how = set_key_limits(f"sqlite:///{db}", SECRET)
    specs = [TargetSpec(ON, "chatgate", store_url=f"sqlite:///{db}"), TargetSpec(OFF, "chatgate")]
    small, stream = ctx.bodies["small"].read_bytes(), ctx.bodies["small_stream"].read_bytes()
    with Cluster("limits", UpstreamSpec(), specs, ctx.workdir, small, ctx.chatgate_problem) as cl:
        targets = cl.live([ON, OFF])
        if len(targets) < 2:
            why = "; ".join(f"{k}: {v}" for k, v in cl.skipped([ON, OFF]).items()) or "not started"
            for _, name in checks:
                res.skip(name, f"≥ {RATIO:g}", why)
            return
        on, off = targets
        others = [p for p in cl.procs if p not in (on.proc, off.proc)]  # the upstream
        applied = (limit_header(on.port, small, SECRET), limit_header(off.port, small, SECRET))
        for t in targets:
            warm_up(t.port, [small, stream], 100 if s.quick else 200)
            if not s.quick:
                wrk_sample(t, ctx.bodies["small"], 16, 1)
        per_config = {}
        for tag, body in (("c16_", ctx.bodies["small"]), ("c16s_", ctx.bodies["small_stream"])):
            measure = wrk_measure(body, 16, s.wrk_seconds)
            per_config[tag] = side_by_side(ctx, res, targets, others, measure, tag, _rounds(ctx))
        still = limit_header(on.port, small, SECRET)
    res.check(
        "limits applied, one replica (x-ratelimit-limit-requests with / without)",
        applied == (str(RPM), None) and still == str(RPM),
        f"{applied[0]} / {applied[1]}",
        f"{RPM} / none",
        f"after the runs: {still}",
    )
    for tag, name in checks:
        ratios = round_ratios(per_config[tag], ON, OFF, "rps")
        if not ratios:
            res.skip(name, f"≥ {RATIO:g}", "no measurement")
            continue
        r = median(ratios)
        res.rows[ON][tag + "ratio"], res.rows[OFF][tag + "ratio"] = r, 1.0
        a, b = res.rows[ON][tag + "rps"], res.rows[OFF][tag + "rps"]
        res.check(
            name,
            r >= RATIO,
            f"{r:.3f}",
            f"≥ {RATIO:g}",
            f"{spread(ratios, '{:.3f}')}; {a:.0f} vs {b:.0f} req/s",
        )
    errors = sum(
        int(x.get("errors", 0)) for rounds in per_config.values() for r in rounds for x in r.values()
    )
    res.check(refused, errors == 0, f"{errors}", "0")
    res.notes.append(
        f"one replica: twins on SQLite, {ON} with the limits row for its caller (rates and concurrency in "
        f"process, budgets local), {OFF} without, measured side by side (both loaded at once by wrk, both "
        f"pinned to one CPU, upstream and wrk on the other: bench/measure.py side_by_side); limits written "
        f"with {how}"
    )


# --- two replicas ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One replica called with one key."""

    name: str
    target: Target
    secret: str


def _backends() -> tuple[str | None, str]:
    """(problem or None, the name of a fresh PostgreSQL database) after checking PostgreSQL and Redis."""
    name = f"chatgate_bench_{os.getpid()}_{int(time.time())}"
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except Exception as exc:
        return f"PostgreSQL at {PG_ADMIN_URL} unusable: {type(exc).__name__}: {exc}"[:300], name
    try:
        import redis

        client = redis.Redis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
        client.ping()
        client.flushdb()
        client.close()
    except Exception as exc:
        _drop(name)
        return f"Redis at {REDIS_URL} unusable: {type(exc).__name__}: {exc}"[:300], name
    return None, name


def _drop(name: str) -> None:
    with contextlib.suppress(Exception):
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    with contextlib.suppress(Exception):
        import redis

        client = redis.Redis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
        client.flushdb()
        client.close()


def _replicas(ctx: Context, res: ScenarioResult) -> None:
    check = "added p50 at c=1, two replicas on PostgreSQL + Redis, limited minus unlimited key"
    refused = "requests refused or failed for the limited key, two replicas (wrk non-2xx, errors)"
    if ctx.chatgate_problem:
        res.skip(check, f"≤ {ADDED_MS:g} ms", ctx.chatgate_problem)
        return
    problem, db = _backends()
    if problem is not None:
        res.skip(check, f"≤ {ADDED_MS:g} ms", problem)
        return
    try:
        _measure_replicas(ctx, res, PG_BASE + db, check, refused)
    finally:
        _drop(db)


def _measure_replicas(ctx: Context, res: ScenarioResult, pg_url: str, check: str, refused: str) -> None:
    s = ctx.settings
    how = set_key_limits(pg_url, LIMITED)
    env = (("CHATGATE_LIMITS_REDIS_URL", REDIS_URL), ("CHATGATE_LIMITS_BUDGETS", "store"))
    specs = [TargetSpec(name, "chatgate", store_url=pg_url, env=env) for name in REPLICAS]
    small, stream = ctx.bodies["small"].read_bytes(), ctx.bodies["small_stream"].read_bytes()
    with Cluster("limits-pg", UpstreamSpec(), specs, ctx.workdir, small, ctx.chatgate_problem) as cl:
        targets = cl.live(list(REPLICAS))
        if len(targets) < 2:
            why = "; ".join(f"{k}: {v}" for k, v in cl.skipped(list(REPLICAS)).items()) or "not started"
            res.skip(check, f"≤ {ADDED_MS:g} ms", why)
            return
        variants = [
            Variant(f"{t.name} {label}", t, secret)
            for t in targets
            for label, secret in (("limited key", LIMITED), ("unlimited key", FREE))
        ]
        applied = {v.name: limit_header(v.target.port, small, v.secret) for v in variants}
        for v in variants:
            auth = f"Bearer {v.secret}"
            warm_up(v.target.port, [small, stream], 50 if s.quick else 100, authorization=auth)
            if not s.quick:
                wrk_sample(v.target, ctx.bodies["small"], 1, 1, authorization=auth)

        def measure(v: Variant) -> dict[str, Any]:
            auth = f"Bearer {v.secret}"
            return wrk_sample(v.target, ctx.bodies["small"], 1, s.wrk_seconds, authorization=auth)

        rounds = alternating(ctx, res, variants, measure, "c1_", _rounds(ctx))
        evidence = _evidence(pg_url)
    ok_applied = all((applied[v.name] == str(RPM)) == (v.secret == LIMITED) for v in variants)
    res.check(
        "limits applied, two replicas (x-ratelimit-limit-requests limited / unlimited key)",
        ok_applied,
        "yes" if ok_applied else "no",
        f"{RPM} / none on both",
        "; ".join(f"{k}: {v}" for k, v in applied.items()) + f"; {evidence}",
    )
    added: list[float] = []
    per_replica: dict[str, list[float]] = {}
    for t in targets:
        on, off = f"{t.name} limited key", f"{t.name} unlimited key"
        values = [r[on]["p50_ms"] - r[off]["p50_ms"] for r in rounds if on in r and off in r]
        per_replica[t.name] = values
        added += values
        if values and on in res.rows:
            res.rows[on]["c1_added_ms"] = median(values)
            res.rows[off]["c1_added_ms"] = 0.0
    if not added:
        res.skip(check, f"≤ {ADDED_MS:g} ms", "no measurement")
    else:
        a = median(added)
        detail = f"{spread(added, '{:.3f}')} over both replicas; per round: " + "; ".join(
            f"{name} " + ", ".join(f"{x:+.3f}" for x in values) for name, values in per_replica.items()
        )
        res.check(check, a <= ADDED_MS, f"{a:.3f} ms", f"≤ {ADDED_MS:g} ms", detail)
    errors = sum(int(x.get("errors", 0)) for r in rounds for n, x in r.items() if "unlimited" not in n)
    res.check(refused, errors == 0, f"{errors}", "0")
    res.notes.append(
        "two replicas: the same two processes (PostgreSQL store, CHATGATE_LIMITS_REDIS_URL, "
        "CHATGATE_LIMITS_BUDGETS=store) serve a limited key and an unlimited one, so 'limits off' is "
        "measured on the same replicas, pools and warm-up: the unlimited caller pays the two cached limit "
        "look-ups every caller pays once limits exist; the limited one adds the Redis scripts (acquire, "
        "release) and its budget: a lease in PostgreSQL, renewed about every 32 requests and flushed every "
        f"50 ms, so most requests reserve and settle in the process. Limits written with {how}"
    )


def _evidence(pg_url: str) -> str:
    """That the shared backends were used: Redis keys for the limited key, its spend in the store's ledger."""
    parts = []
    try:
        import redis

        client = redis.Redis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
        keys = client.keys(f"chatgate:rl:key:{fingerprint(LIMITED)}:*")
        parts.append(f"Redis keys for the limited key: {len(keys)}")
        client.close()
    except Exception as exc:
        parts.append(f"Redis not readable: {exc}")
    try:
        from chatgate.quotas.periods import period_start
        from chatgate.store import open_store

        store = open_store(pg_url)
        try:
            now = time.time()
            spent, held = store.budget_state("key", fingerprint(LIMITED), period_start(now, "month"), now)
        finally:
            store.close()
        parts.append(f"its budget ledger in PostgreSQL: spent ${spent / 1e12:.4f}, held ${held / 1e12:.4f}")
    except Exception as exc:
        parts.append(f"ledger not readable: {type(exc).__name__}: {exc}")
    return "; ".join(parts)
