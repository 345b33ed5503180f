"""The markers step: every event's text is scanned for live canary markers (`AnswerScan`: its
text and size are kept for the detective and the estimate too); text that may be the start of
a marker is held until the events after it show it is not one, or the stream ends.

Invariant: an event is scanned before it can reach the client; what is held goes on in order,
before the event that ends the doubt.
"""

from __future__ import annotations

from gateway.audit import sse
from gateway.audit.answer.step import Do, Seen
from gateway.audit.context import AnswerContext
from gateway.verify.scan import AnswerScan


class Markers:
    __slots__ = ("_held", "scan")

    def __init__(self, ctx: AnswerContext) -> None:
        self.scan = AnswerScan(ctx.markers, ctx.path)
        self._held: list[sse.Event] = []

    def see(self, event: sse.Event) -> Seen:
        scan = self.scan
        scan.event(event.raw)
        if scan.marker_started:
            self._held.append(event)
            return Do.HOLD
        if self._held:
            held, self._held = self._held, []
            return (*held, event)
        return event

    def finish(self) -> list[sse.Event]:
        held, self._held = self._held, []
        return held
