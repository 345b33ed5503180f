"""When to send: the request rate limit and the retry schedule (Retry-After, backoff).

Invariant: waits are bounded: a Retry-After longer than `max_wait_s` gives up instead of
sleeping, and a request is attempted at most `attempts` times.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 5
    base_s: float = 0.5  # the first backoff; doubles per attempt, with jitter
    max_backoff_s: float = 30.0
    max_wait_s: float = 120.0  # the longest Retry-After the probe will honour
    sleep: Sleep = field(default=asyncio.sleep, repr=False, compare=False)

    def backoff(self, attempt: int) -> float:
        """Full-jitter exponential backoff after failed attempt number `attempt` (1-based)."""
        cap = min(self.max_backoff_s, self.base_s * 2.0 ** (attempt - 1))
        return random.uniform(0.5, 1.0) * cap


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header: delta-seconds or an HTTP date; None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class Pacer:
    """At most `rate` request starts per second (None: no limit). One per probe, shared by
    both credentials, because the probe sends one request at a time."""

    def __init__(
        self,
        rate: float | None,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate is not None and rate <= 0:
            raise ValueError("rate must be positive")
        self._interval = 0.0 if rate is None else 1.0 / rate
        self._sleep, self._clock = sleep, clock
        self._next = 0.0

    async def wait(self) -> None:
        now = self._clock()
        if now < self._next:
            await self._sleep(self._next - now)
            now = self._next
        self._next = now + self._interval
