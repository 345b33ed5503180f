"""The fingerprint step: vLLM stamps `system_fingerprint` on each choice's finish chunk, unless
`include_usage` is on, when it goes on the usage-only event instead. For a client that did not
ask for usage (the gateway asked for it), a finish chunk without one is held until the next
event; when that is the usage-only event, its fingerprint goes back on the chunk, as vLLM would
have sent it direct. (With `n` > 1, a choice that finished before the others gets none.)

Invariant: nothing is held for a client that asked for usage, nor past the next event; a chunk
gains only a `system_fingerprint` field, as its last key, and only the usage-only event's.
"""

from __future__ import annotations

import re
from typing import Final

import orjson

from gateway.audit import sse
from gateway.audit.answer.step import Do, Seen
from gateway.audit.context import AnswerContext

_FINISHED: Final = re.compile(rb'"finish_reason":\s*"')  # a string, never null
_FINGERPRINT: Final = b'"system_fingerprint"'


class Fingerprint:
    __slots__ = ("_held", "_on")

    def __init__(self, ctx: AnswerContext) -> None:
        self._on = not ctx.usage_asked
        self._held: list[sse.Event] = []  # finish chunks, until the event after them

    def see(self, event: sse.Event) -> Seen:
        if not self._on:
            return event
        raw = event.raw
        if _FINGERPRINT not in raw and _FINISHED.search(raw) is not None:
            self._held.append(event)
            return Do.HOLD
        if not self._held:
            return event
        held, self._held = self._held, []
        mark = _fingerprint(event) if _FINGERPRINT in raw else None
        if mark is None:
            return (*held, event)
        return (*(_stamped(chunk, mark) for chunk in held), event)

    def finish(self) -> list[sse.Event]:
        held, self._held = self._held, []
        return held


def _fingerprint(event: sse.Event) -> bytes | None:
    """The usage-only event's `system_fingerprint`, as JSON; None for any other event."""
    data = event.json()
    if not isinstance(data, dict) or data.get("choices") != [] or "usage" not in data:
        return None
    mark = data.get("system_fingerprint")
    return orjson.dumps(mark) if isinstance(mark, str) else None


def _stamped(event: sse.Event, mark: bytes) -> sse.Event:
    """`event` with `"system_fingerprint": mark` last in its object (vLLM's place for it)."""
    data = event.json()
    if not isinstance(data, dict) or not data or event.data is None:
        return event
    body = event.data.rstrip()
    return sse.parse(sse.with_data(event.raw, body[:-1] + b',"system_fingerprint":' + mark + b"}"))
