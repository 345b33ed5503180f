"""Token budgets every worker of one gateway shares: per subject (a tenant, or one registry key)
the tokens spent in the current hour, day and month (calendar periods in UTC), in a memory-mapped
table in the state directory, changed under `flock`. The Redis twin is `gateway.fleet.budgets`.

Invariant: a charge is a read-modify-write under the lock, so N workers count every token once;
a window's count only grows until the window ends, and the table survives restarts (a month's
budget is not renewed by restarting the gateway).
"""

from __future__ import annotations

import calendar
import fcntl
import mmap
import os
import struct
import time
import zlib
from pathlib import Path
from typing import Final

PERIODS: Final = ("hour", "day", "month")
_SLOT: Final = struct.Struct("<64s" + "dq" * len(PERIODS))  # subject, (window start, spent) x3
_HEAD: Final = struct.Struct("<8sq")
MAGIC: Final = b"KVFBUD01"
SLOTS: Final = 8192


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


class LocalBudgets:
    """Open in each worker (after fork)."""

    def __init__(self, path: Path) -> None:
        size = _HEAD.size + SLOTS * _SLOT.size
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            head = os.pread(self._fd, _HEAD.size, 0)
            if len(head) < _HEAD.size or _HEAD.unpack(head) != (MAGIC, SLOTS):
                os.ftruncate(self._fd, 0)
                os.ftruncate(self._fd, size)
                os.pwrite(self._fd, _HEAD.pack(MAGIC, SLOTS), 0)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._map = mmap.mmap(self._fd, size)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)

    def _slot(self, subject: str, claim: bool) -> int | None:
        """The subject's slot (found, or claimed when `claim`; called under the lock)."""
        name = subject.encode()[:64].ljust(64, b"\0")
        start = zlib.crc32(name) % SLOTS
        for probe in range(SLOTS):
            slot = (start + probe) % SLOTS
            at = _HEAD.size + slot * _SLOT.size
            held = self._map[at : at + 64]
            if held == name:
                return slot
            if held == b"\0" * 64:
                if not claim:
                    return None
                _SLOT.pack_into(self._map, at, name, *([0.0, 0] * len(PERIODS)))
                return slot
        raise RuntimeError("the budgets table is full")  # 8192 subjects with budgets

    def _spent(self, slot: int | None, now: float) -> dict[str, int]:
        if slot is None:
            return dict.fromkeys(PERIODS, 0)
        fields = _SLOT.unpack_from(self._map, _HEAD.size + slot * _SLOT.size)
        out = {}
        for i, period in enumerate(PERIODS):
            start, spent = fields[1 + 2 * i], fields[2 + 2 * i]
            out[period] = spent if start == window(period, now)[0] else 0
        return out

    def spent(self, subject: str, now: float | None = None) -> dict[str, int]:
        """Tokens spent in each current window."""
        now = time.time() if now is None else now
        fcntl.flock(self._fd, fcntl.LOCK_SH)
        try:
            return self._spent(self._slot(subject, claim=False), now)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def charge(self, subject: str, tokens: int, now: float | None = None) -> dict[str, int]:
        """Add `tokens` to each current window; returns the new counts."""
        now = time.time() if now is None else now
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            slot = self._slot(subject, claim=True)
            assert slot is not None
            spent = self._spent(slot, now)
            values: list[float | int] = []
            for period in PERIODS:
                spent[period] += tokens
                values += [window(period, now)[0], spent[period]]
            at = _HEAD.size + slot * _SLOT.size
            _SLOT.pack_into(self._map, at, subject.encode()[:64].ljust(64, b"\0"), *values)
            return spent
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
