"""The steps of one stream, run in order (`gateway.audit.exchange.ANSWER`): chunks are framed
into events (`gateway.audit.sse`), each event passes the steps until one holds or drops it, and
at the end what each step held passes the steps after it.

Invariant: bytes come out in the order they came in, except what a step held, which goes on in
order where that step lets it go; framing is done here and by nothing else on the stream.
"""

from __future__ import annotations

from typing import TypeVar

from gateway.audit import sse
from gateway.audit.answer.step import Do, Step

_S = TypeVar("_S")


class Pipe:
    __slots__ = ("_reader", "_sees", "_steps")

    def __init__(self, steps: tuple[Step, ...]) -> None:
        self._steps = steps
        self._sees = tuple(step.see for step in steps)  # bound once, called for every event
        self._reader = sse.Reader()

    def find(self, kind: type[_S]) -> _S:
        """The step of `kind`."""
        return next(step for step in self._steps if isinstance(step, kind))

    def complete(self, chunk: bytes) -> bytes:
        """The events `chunk` completes (with what waited before them), as bytes."""
        return self._reader.feed(chunk) if chunk else b""

    def tail(self) -> bytes:
        """The stream ended: its last event, if it came without its blank line."""
        return self._reader.end()

    def flow(self, events: bytes) -> bytes:
        """Complete events in; what passes every step out."""
        out: list[bytes] = []
        for event in sse.events(events):
            self._through(event, 0, out)
        return out[0] if len(out) == 1 else b"".join(out)

    def flush(self) -> bytes:
        """The stream ended: what each step held, in order, through the steps after it."""
        out: list[bytes] = []
        for at, step in enumerate(self._steps, 1):
            for event in step.finish():
                self._through(event, at, out)
        return b"".join(out)

    def _through(self, event: sse.Event, at: int, out: list[bytes]) -> None:
        sees = self._sees
        for i in range(at, len(sees)):
            seen = sees[i](event)
            if seen is event:  # passed as it came: nearly every event at nearly every step
                continue
            if isinstance(seen, sse.Event):
                event = seen
            elif isinstance(seen, Do):
                return
            else:  # what the step held, then this event
                for each in seen:
                    self._through(each, i + 1, out)
                return
        out.append(event.raw)
