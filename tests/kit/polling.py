"""The one way tests wait for something: poll a condition until it holds or a deadline passes.
Readiness is never a bare sleep."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def until(
    check: Callable[[], T | Awaitable[T]], timeout_s: float = 10.0, what: str = "the condition"
) -> T:
    """Poll `check` (plain or async) until it returns a truthy value and return that value;
    AssertionError naming `what` once `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        assert time.monotonic() < deadline, f"{what} did not hold within {timeout_s:g} s"
        await asyncio.sleep(0.02)


def until_sync(check: Callable[[], T], timeout_s: float, interval_s: float = 0.5) -> T | None:
    """Blocking form for threads and subprocesses: `check`'s first truthy value, or None at the
    deadline. `check` may itself wait (e.g. on a process), which then paces the loop."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval_s)
    return None
