"""Budget periods: calendar day, week (from Monday) and month in UTC, or the total since ever."""

from __future__ import annotations

import datetime as dt
import functools

PERIODS = ("day", "week", "month", "total")


def period_start(ts: float, period: str) -> float:
    """Unix time at which the period holding `ts` began (0 for "total")."""
    if period == "total":
        return 0.0
    return _start_of(int(ts // 86400), period)  # POSIX days are 86,400 s long: no leap seconds


@functools.lru_cache(maxsize=64)
def _start_of(day_number: int, period: str) -> float:
    day = dt.datetime.fromtimestamp(day_number * 86400, dt.UTC)
    if period == "week":
        day -= dt.timedelta(days=day.weekday())
    elif period == "month":
        day = day.replace(day=1)
    elif period != "day":
        raise ValueError(f"unknown budget period {period!r}; expected one of {', '.join(PERIODS)}")
    return day.timestamp()


def period_end(ts: float, period: str) -> float | None:
    """When the period holding `ts` ends (None for "total")."""
    if period == "total":
        return None
    start = dt.datetime.fromtimestamp(period_start(ts, period), dt.UTC)
    if period == "day":
        end = start + dt.timedelta(days=1)
    elif period == "week":
        end = start + dt.timedelta(days=7)
    else:
        end = (start + dt.timedelta(days=32)).replace(day=1)
    return end.timestamp()
