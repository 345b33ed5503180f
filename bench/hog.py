"""A CPU hog on every core, for the runs that judge a goal on a loaded host: one busy Python
process per core (pure arithmetic, no memory traffic to speak of), each in a session of its own
as another user's or container's work would be (Linux shares the CPU between sessions first,
autogroups), started before the work and stopped after it, even when the work fails.

    with cpu_hog():  # or cpu_hog(0): nothing beside the work
        ...
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def _spin(stop: Any) -> None:
    os.setsid()
    while not stop.is_set():
        sum(range(10_000))


@contextmanager
def cpu_hog(processes: int | None = None) -> Iterator[int]:
    """`processes` busy processes (default: one per core) for the body; yields how many ran."""
    count = (os.cpu_count() or 1) if processes is None else processes
    stop = multiprocessing.Event()
    hogs = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(count)]
    for h in hogs:
        h.start()
    try:
        yield count
    finally:
        stop.set()
        for h in hogs:
            h.join()
