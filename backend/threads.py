"""How many threads the engine's kernels use, step by step: all of them while the host's cores
are free, fewer while other work takes them.

The engine's OpenMP threads spin a little before they sleep (`backend/__init__.py`): on a quiet
host a step's ~150 parallel regions then start without a wake-up each, but a spinning thread
whose sibling lost its core to another process burns the time that sibling needed. So after
each step the governor looks at the last period of work (`period_s`; a rest without work starts
a new one): the cores' worth of CPU time the
host spent on other processes (`/proc/stat` busy time less this process's, `/proc/self/stat`;
a VM's steal time counts as other work). While other work leaves fewer free cores than the
engine has threads (by more than `over` of a core) the count halves; once it leaves room for
twice the count (within `under`), `calm_periods` periods in a row, the count doubles again, up
to `most`. This process's own threads (its event loop) never count against it.

While the engine rests it looks at the host once a period (`resting`, from the engine thread's
wait), and before the first step after a rest (`resume`) it fits the count to the last of those
looks alone: all `most` threads if the host just left room for them, fewer if it did not. What
the host did earlier in the rest (another server's turn, say) says nothing of the cores the
next steps will find; what it did in the last period does. A short request after a rest (a
lone prompt is often one step) so runs on the threads the host has now, not on the count an
earlier burst of other work left.

Invariant: the count stays within [1, most] and changes only between steps, on the engine
thread (`apply`); it is only ever built for a model whose kernels give the same bits at every
count it can choose (`backend.thread_probe`), so a change never changes an answer.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("kvfence.backend.threads")

TICK_S = 1 / os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class Reading:
    """Cumulative counters at one moment, in seconds."""

    wall: float  # monotonic
    host_busy: float  # CPU time the host spent on anything (every core, summed; steal too)
    ours: float  # CPU time of this process (every thread)


def read_host(proc: Path = PROC) -> Reading:
    """The counters now."""
    cpu = [int(v) for v in (proc / "stat").read_text().split("\n", 1)[0].split()[1:9]]
    busy = sum(cpu) - cpu[3] - cpu[4]  # all but idle and iowait
    stat = (proc / "self" / "stat").read_text().rsplit(")", 1)[1].split()
    ours = int(stat[11]) + int(stat[12])  # utime, stime
    return Reading(time.monotonic(), busy * TICK_S, ours * TICK_S)


def readable(proc: Path = PROC) -> bool:
    """Whether this host reports its CPU time and this process's (Linux /proc)."""
    try:
        read_host(proc)
    except (OSError, IndexError, ValueError):
        return False
    return True


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class ThreadGovernor:
    """Call `after_step()` on the engine thread after every step; `threads` is the count now."""

    def __init__(
        self,
        most: int,
        apply: Callable[[int], None],
        read: Callable[[], Reading] = read_host,
        *,
        cores: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        period_s: float = 0.5,
        over: float = 0.5,
        under: float = 0.3,
        calm_periods: int = 3,
    ) -> None:
        if most < 1:
            raise ValueError("most must be at least 1")
        self.most, self.threads = most, most
        self.cores = usable_cores() if cores is None else cores
        self._apply, self._read, self._clock = apply, read, clock
        self._period_s, self._over, self._under = period_s, over, under
        self._calm_needed, self._calm = calm_periods, 0
        self._last = read()
        self._due = clock() + period_s
        self._rested = False
        self._rest_mark = self._last  # while resting: the last look at the host
        self._rest_others: float | None = None  # other work over the rest's last period

    @property
    def period_s(self) -> float:
        return self._period_s

    def idle(self) -> None:
        """The engine ran out of work (called again while it rests: a no-op)."""
        if not self._rested:
            self._rested = True
            self._rest_mark, self._rest_others = self._read(), None

    def resting(self) -> None:
        """About once a period while the engine rests: the host's other work since the last
        look (a look sooner than half a period after it is skipped)."""
        if not self._rested:
            return
        now = self._read()
        span = now.wall - self._rest_mark.wall
        if span < self._period_s / 2:
            return
        busy = now.host_busy - self._rest_mark.host_busy
        self._rest_others = max(0.0, busy - (now.ours - self._rest_mark.ours)) / span
        self._rest_mark = now

    def resume(self) -> None:
        """Before the first step after a rest: the count the host's last period of the rest
        leaves room for (no change when the rest was shorter than a period)."""
        if not self._rested or self._rest_others is None:
            return
        others, self._rest_others = self._rest_others, None
        free = self.cores - others
        if self.threads < self.most and self.most <= free + self._under:
            self._set(self.most, others)
            return
        threads = self.threads
        while threads > 1 and threads > free + self._over:
            threads //= 2
        if threads != self.threads:
            self._set(threads, others)

    def after_step(self) -> None:
        if self._rested:  # the first step after a rest starts a new period
            self._rested = False
            self._last, self._due = self._read(), self._clock() + self._period_s
            return
        if self._clock() < self._due:  # most steps: one clock read, no /proc
            return
        now = self._read()
        self._due = self._clock() + self._period_s
        span = now.wall - self._last.wall
        if span <= 0:
            return
        busy = now.host_busy - self._last.host_busy
        others = max(0.0, busy - (now.ours - self._last.ours)) / span  # cores' worth
        self._last = now
        free = self.cores - others
        if self.threads > 1 and self.threads > free + self._over:
            self._set(max(1, self.threads // 2), others)
            return
        more = min(self.most, self.threads * 2)
        if more > self.threads and more <= free + self._under:
            self._calm += 1
            if self._calm >= self._calm_needed:
                self._set(more, others)
        else:
            self._calm = 0

    def _set(self, threads: int, others: float) -> None:
        log.info(
            "engine threads %d -> %d",
            self.threads,
            threads,
            extra={"other_work_cores": round(others, 2), "cores": self.cores},
        )
        self._apply(threads)
        self.threads, self._calm = threads, 0
