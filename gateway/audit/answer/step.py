"""What every answer step is: it sees one event and passes it (the same or rewritten), holds it
or drops it; `finish` gives back, in order, what it still holds when the stream ends.

Invariant: a step never reorders what it passes; what it held goes on before the next event it
passes (`see` returns both, held first) or from `finish`, never twice.
"""

from __future__ import annotations

import enum
from typing import Protocol

from gateway.audit.sse import Event


class Do(enum.Enum):
    HOLD = "hold"  # the step keeps the event: it goes on later, or never (a withheld answer)
    DROP = "drop"  # the client never gets it


# An event passes alone, or after the events the step held until now.
Seen = Event | tuple[Event, ...] | Do


class Step(Protocol):
    def see(self, event: Event) -> Seen:
        """One complete event, as the steps before this one passed it."""
        ...

    def finish(self) -> list[Event]:
        """The stream ended: what this step still holds, in order, for the steps after it."""
        ...
