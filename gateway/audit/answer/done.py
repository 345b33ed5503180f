"""The done step: the event that ends a stream (`data: [DONE]` for chat and completions, for
Responses its `response.completed`, `.incomplete` or `.failed` event) is held and goes last,
once the whole answer is judged; `ended` says whether the protocol's last event came.

Invariant: no ending event reaches the client before the answer is judged and settled (its
receipt stored), and nothing follows it.
"""

from __future__ import annotations

import re
from typing import Final

from gateway.audit import sse
from gateway.audit.answer.step import Do, Seen
from gateway.audit.context import AnswerContext
from gateway.inputs.paths import RESPONSES

_DONE: Final = b"[DONE]"
_TERMINAL: Final = re.compile(rb'"type":\s*"response\.(?:completed|incomplete|failed)"')


class Done:
    __slots__ = ("_held", "_responses", "ended")

    def __init__(self, ctx: AnswerContext) -> None:
        self._responses = ctx.path == RESPONSES
        self._held: list[sse.Event] = []
        self.ended = False

    def see(self, event: sse.Event) -> Seen:
        raw = event.raw
        if _DONE in raw and event.data == _DONE:
            self._held.append(event)
            self.ended = self.ended or not self._responses
            return Do.HOLD
        if self._responses and b'"response.' in raw and _TERMINAL.search(raw):
            self._held.append(event)
            self.ended = True
            return Do.HOLD
        return event

    def finish(self) -> list[sse.Event]:
        held, self._held = self._held, []
        return held
