"""One deadline for the waits of one attempt (its upstream call, reads and writes): a single
timer, moved lazily. A wait sets its deadline with an attribute write; the timer, when it fires
before that deadline, sets itself again for it; past it, it cancels the waiting task, and the
wait turns that into TimeoutError.

Invariant: used only from the task that made it, one wait at a time; a cancellation the watch did
not cause stays a CancelledError (`Task.uncancel`, as in `asyncio.timeout`); after `close` no
timer of it is left in the loop.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class Watch:
    """`with watch.within(seconds): await ...`: that await ends in TimeoutError once `seconds`
    have passed without it finishing. Arming costs no timer when one is already set earlier.
    `shortest_s`: the shortest wait to come (an answer's first wait is its longest, the upstream
    call): the first timer is set no later than that, so a shorter wait after it sets none."""

    __slots__ = ("_cancelling", "_deadline", "_expired", "_handle", "_loop", "_shortest", "_task",
                 "_waiting", "_when")  # fmt: skip

    def __init__(self, shortest_s: float | None = None) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a Watch is made inside the task whose waits it limits")
        self._task = task
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = None
        self._when = 0.0  # the loop time the timer is set for
        self._deadline = 0.0  # the loop time the current (or next) wait ends
        self._waiting = False
        self._expired = False  # the timer cancelled the task; the wait has not seen it yet
        self._cancelling = 0  # the task's cancellation requests when the wait began
        self._shortest = shortest_s  # until the first timer is set

    def within(self, seconds: float) -> Watch:
        """The next wait may last `seconds` from now."""
        self._deadline = self._loop.time() + seconds
        return self

    def __enter__(self) -> None:
        if self._waiting:
            raise RuntimeError("a Watch limits one wait at a time")
        self._waiting = True
        self._cancelling = self._task.cancelling()
        if self._handle is None or self._deadline < self._when:
            self._set()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._waiting = False
        if self._expired:
            self._expired = False
            # Only our own cancellation becomes a timeout: one more request (the client left)
            # leaves the count above where the wait began, and the cancellation goes on.
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc

    def close(self) -> None:
        """The answer is done: no timer of this watch stays in the loop."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _set(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        when = self._deadline
        if self._shortest is not None:  # the first timer: early enough for the shortest wait
            when = min(when, self._loop.time() + self._shortest)
            self._shortest = None
        self._when = when
        self._handle = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._handle = None
        if not self._waiting:
            return  # nothing to cut: the next wait sets the timer again
        if self._deadline > self._when:
            self._set()  # the waits moved the deadline on since the timer was set
            return
        self._expired = True
        self._task.cancel()
