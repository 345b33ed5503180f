"""The attestation step: an attestation in any event after a stream's first is counted (our
backend puts its one attestation in the first: a second is refused, never chosen) and taken
out of what the client gets (`gateway.audit.events`).

Invariant: an event without "kvfence" in its bytes passes untouched and unparsed; no event the
client gets carries an attestation's event name or field.
"""

from __future__ import annotations

from typing import Final

from gateway.audit import sse
from gateway.audit.answer.step import Do, Seen
from gateway.audit.context import AnswerContext
from gateway.audit.events import split_attestation_event, strip_events
from kvfence.attestation import ATTESTATION_EVENT, ATTESTATION_FIELD

_TAGS: Final = (ATTESTATION_EVENT.encode(), ATTESTATION_FIELD.encode())  # both hold "kvfence"


class Attestation:
    __slots__ = ("_attested", "late")

    def __init__(self, ctx: AnswerContext) -> None:
        self._attested = ctx.audit.attested
        self.late = 0  # attestations seen after the first event (only counted when attested)

    @staticmethod
    def first(event: bytes) -> tuple[str | None, bytes]:
        """A stream's first event: its attestation token, and its bytes without it (which
        then pass the steps like any event: an attestation left in them counts)."""
        return split_attestation_event(event)

    def see(self, event: sse.Event) -> Seen:
        raw = event.raw
        if b"kvfence" not in raw:
            return event
        if self._attested:
            self.late += sum(raw.count(tag) for tag in _TAGS)
        clean = strip_events(raw)
        if clean is raw:
            return event
        return sse.parse(clean) if clean else Do.DROP

    def finish(self) -> list[sse.Event]:
        return []
