"""Calendar windows (UTC) of the token budgets' periods: the hour, day and month holding a time.
Pure: no I/O."""

from __future__ import annotations

import calendar
import time
from typing import Final

PERIODS: Final = ("hour", "day", "month")


def window(period: str, now: float) -> tuple[float, float]:
    """The calendar window (UTC) holding `now`: its start and end, in epoch seconds."""
    t = time.gmtime(now)
    if period == "hour":
        start = calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, 0, 0))
        return start, start + 3600
    if period == "day":
        start = calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0))
        return start, start + 86400
    start = calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0))
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return start, calendar.timegm((year, month, 1, 0, 0, 0))


def starts(now: float) -> dict[str, int]:
    """Each period's current window start."""
    return {period: int(window(period, now)[0]) for period in PERIODS}
