"""The usage dashboard: `GET /admin/dashboard` (a static page) and the admin-only JSON it draws from.

The page itself holds no data, so it is served to anyone; it asks for the admin key, keeps it in
sessionStorage and sends it as `Authorization: Bearer <admin key>` to:

- `GET /admin/usage?by=...` (chatgate.web.routes) for totals,
- `GET /admin/usage/timeseries?by=team|key|model&bucket=day|hour[&since=&until=]`: tokens and cost
  per group per time bucket, built from `chatgate.metering.reports.build_report` over each bucket,
- `GET /admin/latency`: latency p50 and p95 per model of the answered requests,
- `GET /admin/cache?by=team` (chatgate.web.routes): the Cache card's costliest prefix breaks,
- `GET /admin/rejections`: the requests chatgate refused, by rule code and by limit, and the keys with the
  most of them, both from the store (every replica),
- `GET /admin/accounts`: the DeepSeek accounts of the pool and each one's state
  (chatgate/gateway/accounts.py),
- `GET /admin/refusals` and `GET /admin/refusals/{request_id}` (chatgate.web.refusals): the recent refusals,
- `GET /user/balance` (chatgate.web.routes, managed mode): the DeepSeek account's balance.

Every endpoint of the page's own takes `since`, `until` (a time, or 24h, 7d, today), `team` and `key` (a
key id or a passthrough fingerprint) to select the records, as `/admin/usage` does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from chatgate.errors import APIError
from chatgate.gateway.auth import address_of, require_admin
from chatgate.gateway.responses import json_response
from chatgate.metering.reports import ReportError, build_report, hit_rate, parse_time
from chatgate.store.base import GroupBy, ReportQuery, Store, UsageStore

if TYPE_CHECKING:
    from chatgate.gateway.state import State

STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC_FILES = {"dashboard.js": "text/javascript; charset=utf-8", "dashboard.css": "text/css; charset=utf-8",
                "rules.js": "text/javascript; charset=utf-8"}
BUCKETS = {"day": 86400, "hour": 3600}
DEFAULT_SPAN = {"day": 14, "hour": 48}  # buckets shown when `since` is not given
MAX_BUCKETS = 400
SERIES_BY = ("team", "key", "model")
LATENCY_SAMPLE = 20_000  # the newest answered requests the percentiles are taken over
# the requests that got no answer of DeepSeek's model: refused by chatgate's rules, by its limits, refused by
# DeepSeek (4xx), failed at DeepSeek (5xx, no answer); chatgate/store/base.py COUNTERS
REFUSED = ("rejected", "limited", "upstream_refused", "upstream_failed")
PAGE_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


def add_dashboard(app: FastAPI, state: State) -> None:
    """Register the dashboard page, its static files and its admin-only JSON endpoints."""
    async def page(request: Request) -> Response:
        return _static("dashboard.html", "text/html; charset=utf-8")

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC_FILES:
            raise APIError(404, f"No dashboard file {name!r}.", "invalid_request_error", None, "not_found")
        return _static(name, STATIC_FILES[name])

    async def timeseries(request: Request) -> Response:
        require_admin(state.gw.auth, request.headers.get("authorization"), address_of(request))
        store = _need_store(state)
        q = request.query_params
        by, bucket = q.get("by", "team"), q.get("bucket", "day")
        if by not in SERIES_BY:
            raise _bad("by", f"'by' must be one of {', '.join(SERIES_BY)}, got {by!r}.")
        if bucket not in BUCKETS:
            raise _bad("bucket", f"'bucket' must be day or hour, got {bucket!r}.")
        selected = selection(request)
        starts = bucket_starts(bucket, selected.since, selected.until, time.time())
        if len(starts) > MAX_BUCKETS:
            raise _bad("since", f"That range has more than the {MAX_BUCKETS} {bucket} buckets allowed.")
        body = await asyncio.to_thread(build_timeseries, store, by, bucket, starts, state.currency, selected)
        return json_response(200, body, {"cache-control": "no-store"})

    async def rejections(request: Request) -> Response:
        require_admin(state.gw.auth, request.headers.get("authorization"), address_of(request))
        store = _need_store(state)
        selected = selection(request)
        offenders = await asyncio.to_thread(top_offenders, store, 10, selected)
        by_rule = await asyncio.to_thread(rejections_by_rule, store, selected)
        return json_response(200, {
            "by_rule": by_rule,
            "top_offenders": offenders,
        }, {"cache-control": "no-store"})

    async def repairs(request: Request) -> Response:
        require_admin(state.gw.auth, request.headers.get("authorization"), address_of(request))
        store = _need_store(state)
        by_code = await asyncio.to_thread(repairs_by_code, store, selection(request))
        return json_response(200, {"by_code": by_code}, {"cache-control": "no-store"})

    async def latency(request: Request) -> Response:
        require_admin(state.gw.auth, request.headers.get("authorization"), address_of(request))
        store = _need_store(state)
        sample = await asyncio.to_thread(store.latencies, selection(request), LATENCY_SAMPLE)
        return json_response(200, {"by_model": latency_by_model(sample), "sample": LATENCY_SAMPLE},
                             {"cache-control": "no-store"})

    async def accounts(request: Request) -> Response:
        """The DeepSeek accounts of the pool (managed mode) and each one's state; never a key."""
        require_admin(state.gw.auth, request.headers.get("authorization"), address_of(request))
        pool = state.gw.pool
        rows = pool.states() if pool is not None else []
        return json_response(200, {"data": rows, "mode": state.settings.auth.mode},
                             {"cache-control": "no-store"})

    router = app.router
    router.add_route("/admin/accounts", accounts, methods=["GET"], include_in_schema=False)
    router.add_route("/admin/dashboard", page, methods=["GET"], include_in_schema=False)
    router.add_route("/admin/dashboard/{name}", static, methods=["GET"], include_in_schema=False)
    router.add_route("/admin/usage/timeseries", timeseries, methods=["GET"], include_in_schema=False)
    router.add_route("/admin/rejections", rejections, methods=["GET"], include_in_schema=False)
    router.add_route("/admin/repairs", repairs, methods=["GET"], include_in_schema=False)
    router.add_route("/admin/latency", latency, methods=["GET"], include_in_schema=False)


def _static(name: str, media_type: str) -> Response:
    return Response((STATIC_DIR / name).read_bytes(), 200, headers=PAGE_HEADERS, media_type=media_type)


def _need_store(state: State) -> Store:
    if state.store is None:
        raise APIError(503, "Metering is off (store.url = none).", "server_error", None, "no_store")
    return state.store


def _bad(param: str, message: str) -> APIError:
    return APIError(400, message, "invalid_request_error", param, "invalid_value")


def selection(request: Request) -> ReportQuery:
    """The records a dashboard request asks for: `since`, `until`, `team`, `key` (group_by: the caller's)."""
    q = request.query_params
    try:
        since, until = parse_time(q.get("since"), "since"), parse_time(q.get("until"), "until")
    except ReportError as exc:
        raise _bad("since", str(exc)) from None
    return ReportQuery("team", since, until, q.get("team") or None, q.get("key") or None)


def percentile(ordered: list[float], share: float) -> float:
    """The nearest-rank percentile of sorted values (one of them, never an interpolation)."""
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def latency_by_model(sample: list[tuple[str, float]]) -> list[dict[str, Any]]:
    """p50 and p95 (ms, nearest rank) and the count per model, the busiest model first."""
    by_model: dict[str, list[float]] = {}
    for model, ms in sample:
        by_model.setdefault(model, []).append(ms)
    rows = []
    for model, values in by_model.items():
        values.sort()
        rows.append({"model": model, "count": len(values), "p50_ms": round(percentile(values, 0.5), 1),
                     "p95_ms": round(percentile(values, 0.95), 1)})
    return sorted(rows, key=lambda r: (-r["count"], r["model"]))


def bucket_starts(bucket: str, since: float | None, until: float | None, now: float) -> list[float]:
    """Bucket start times (unix seconds, aligned to UTC days or hours) covering [since, until)."""
    width = BUCKETS[bucket]
    end = until if until is not None else now
    last = end - (end % width) if end % width else end - width  # the bucket holding `end` (exclusive)
    first = since - (since % width) if since is not None else last - (DEFAULT_SPAN[bucket] - 1) * width
    if last < first:
        return []
    count = int((last - first) // width) + 1
    if count > MAX_BUCKETS:  # the caller refuses it: say how many without building them
        return [first + i * width for i in range(MAX_BUCKETS + 1)]
    return [first + i * width for i in range(count)]


def _label(by: str, row: dict[str, Any]) -> str:
    if by == "key":
        return str(row.get("key_name") or row.get("key_id") or "?")
    return str(row.get(by) or "?")


def build_timeseries(store: UsageStore, by: str, bucket: str, starts: list[float], currency: str = "USD",
                     selected: ReportQuery | None = None) -> dict[str, Any]:
    """Tokens (prompt + completion), cost (`cost`, in `currency`; `cost_usd` apart), requests and the context
    cache's hit rate (None without prompt tokens) per group for each bucket, zero-filled."""
    width = BUCKETS[bucket]
    series: dict[str, dict[str, Any]] = {}
    for i, start in enumerate(starts):
        report = build_report(store, ReportQuery(by, start, start + width,  # type: ignore[arg-type]
                                                 selected.team if selected else None,
                                                 selected.key_id if selected else None), currency)
        for row in report["rows"]:
            label = _label(by, row)
            entry = series.setdefault(label, {
                "label": label, "team": row.get("team"), "key_id": row.get("key_id"),
                "tokens": [0] * len(starts), "cost_usd": [0.0] * len(starts), "cost": [0.0] * len(starts),
                "requests": [0] * len(starts), **{name: [0] * len(starts) for name in REFUSED},
                "prompt_tokens": [0] * len(starts), "cache_hit_tokens": [0] * len(starts)})
            entry["tokens"][i] += row["prompt_tokens"] + row["completion_tokens"]
            entry["prompt_tokens"][i] += row["prompt_tokens"]
            entry["cache_hit_tokens"][i] += row["prompt_cache_hit_tokens"]
            entry["cost_usd"][i] = round(entry["cost_usd"][i] + row["cost_usd"], 9)
            entry["cost"][i] = round(entry["cost"][i] + row["cost"], 9)
            entry["requests"][i] += row["requests"]
            for name in REFUSED:
                entry[name][i] += row[name]
    for entry in series.values():
        entry["hit_rate"] = [hit_rate(h, p) for h, p in zip(entry["cache_hit_tokens"], entry["prompt_tokens"],
                                                             strict=True)]
        entry["total_tokens"] = sum(entry["tokens"])
        entry["total_cost_usd"] = round(sum(entry["cost_usd"]), 9)
        entry["total_cost"] = round(sum(entry["cost"]), 9)
    fmt = "%Y-%m-%d" if bucket == "day" else "%Y-%m-%dT%H:00Z"
    return {
        "by": by, "bucket": bucket, "currency": currency,
        "buckets": [dt.datetime.fromtimestamp(s, dt.UTC).strftime(fmt) for s in starts],
        "bucket_starts": starts,
        "series": sorted(series.values(), key=lambda e: (-e["total_tokens"], e["label"])),
    }


def _grouped(selected: ReportQuery | None, group_by: GroupBy) -> ReportQuery:
    return dataclasses.replace(selected, group_by=group_by) if selected else ReportQuery(group_by)


def top_offenders(store: UsageStore, limit: int, selected: ReportQuery | None = None) -> list[dict[str, Any]]:
    """Keys with the most requests refused by chatgate (by a rule or a limit), most first."""
    rows = build_report(store, _grouped(selected, "key"))["rows"]
    worst = sorted((r for r in rows if r["rejected"] or r["limited"]),
                   key=lambda r: (-r["rejected"] - r["limited"], str(r["key_id"])))
    return [{"key_id": r["key_id"], "key_name": r["key_name"], "team": r["team"], "rejected": r["rejected"],
             "limited": r["limited"], "requests": r["requests"]} for r in worst[:limit]]


def rejections_by_rule(store: UsageStore, selected: ReportQuery | None = None) -> list[dict[str, Any]]:
    """Requests chatgate refused, by rule code (`kind` "rule") and by limit (`kind` "limit": rpm:key,
    budget:team ...; all time, every replica that writes to this store), most first."""
    rows = build_report(store, _grouped(selected, "rule"))["rows"]
    counts = [(str(r["rule_code"]), kind, int(r[name])) for r in rows
              for kind, name in (("rule", "rejected"), ("limit", "limited")) if r[name]]
    return [{"code": code, "kind": kind, "count": n}
            for code, kind, n in sorted(counts, key=lambda c: (-c[2], c[0], c[1]))]


def repairs_by_code(store: UsageStore, selected: ReportQuery | None = None) -> list[dict[str, Any]]:
    """Requests chatgate repaired, per repair code (every replica), most first."""
    rows = build_report(store, _grouped(selected, "repair"))["rows"]
    counts = [(str(r["repair"]), int(r["requests"])) for r in rows if r["repair"]]
    return [{"code": code, "count": n} for code, n in sorted(counts, key=lambda kv: (-kv[1], kv[0]))]
