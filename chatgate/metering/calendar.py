"""DeepSeek's peak calendar: whether a moment is billed at peak or off-peak prices
(docs/metering.md#the-peak-calendar).

Before `peak_since` DeepSeek had one price all day: every minute is at the full (peak) price (the
catalogue's rows of that time are flat). From `peak_since` the peak windows (UTC) apply every day; from
`weekdays_since` only Monday to Friday, Chinese public holidays excepted, the weekday and the holiday
judged on the Beijing date (UTC+8). Days in `peak_days` (make-up working days, when configured) are priced
as weekdays.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

BEIJING = 8 * 3600
DAY = 86400
_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()


def _minutes(hhmm: str) -> int:
    h, m = hhmm.split(":")
    return int(h) * 60 + int(m)


def minute_set(windows: Iterable[str]) -> frozenset[int]:
    """The minutes of the day (UTC) inside the windows; a window whose end is before its start crosses
    midnight: [start, 24:00) and [00:00, end)."""
    minutes: set[int] = set()
    for window in windows:
        start, end = (_minutes(part) for part in window.split("-"))
        if end <= start:
            end += 24 * 60
        minutes.update(m % (24 * 60) for m in range(start, end))
    return frozenset(minutes)


def day_number(date: dt.date) -> int:
    """Days since 1970-01-01."""
    return date.toordinal() - _EPOCH_ORDINAL


class PeakCalendar:
    def __init__(self, windows: Iterable[str], peak_since: float, weekdays_since: float,
                 holidays: Iterable[dt.date], peak_days: Iterable[dt.date] = ()) -> None:
        self.windows = tuple(windows)
        self.peak_since = peak_since
        self.weekdays_since = weekdays_since
        self.holidays = frozenset(day_number(d) for d in holidays)
        self.peak_days = frozenset(day_number(d) for d in peak_days)
        self._minutes = minute_set(self.windows)
        self.last = (-1, False)  # (minute, its answer): (nearly) every request of a minute asks the same

    def is_peak(self, ts: float) -> bool:
        minute = int(ts // 60)  # POSIX time has no leap seconds
        last = self.last
        if last[0] == minute:
            return last[1]
        peak = self._judge(ts, minute)
        self.last = (minute, peak)
        return peak

    def _judge(self, ts: float, minute: int) -> bool:
        if ts < self.peak_since:  # one price all day: the full one
            return True
        if minute % (24 * 60) not in self._minutes:
            return False
        if ts < self.weekdays_since:
            return True
        return self.weekday(ts)

    def weekday(self, ts: float) -> bool:
        """Whether `ts` falls on a day billed as a weekday: Monday to Friday and not a holiday (Beijing
        date), or a configured peak day."""
        day = int((ts + BEIJING) // DAY)
        if day in self.peak_days:
            return True
        return (day + 3) % 7 < 5 and day not in self.holidays  # 1970-01-01 was a Thursday (3)

    def next_peak(self, ts: float, horizon_days: int = 400) -> tuple[float, float] | None:
        """The next peak window at or after `ts`: (start, end) in unix seconds, the one in progress if `ts`
        is inside one; None within `horizon_days`. Only peak hours count (from `peak_since`)."""
        ts = max(ts, self.peak_since)
        first = int(-(-self.peak_since // 60))
        minute = int(ts // 60)
        if self._judge(ts, minute):
            start = minute
            while start > first and self._judge((start - 1) * 60.0, start - 1):
                start -= 1
        else:
            last = minute + horizon_days * 24 * 60
            minute += 1
            while minute < last and not self._judge(minute * 60.0, minute):
                minute += 1
            if minute >= last:
                return None
            start = minute
        end = start
        while self._judge(end * 60.0, end):
            end += 1
        return float(start * 60), float(end * 60)
