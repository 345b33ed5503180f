"""The usage step: reads the usage any event carries (the last one counts), keeps from the
client the usage the gateway asked for itself (the usage-only event, or a chunk's `usage`
object, see `gateway.inputs.stream_options`), and, while the detective judges the answer,
holds every event from the first that carries usage to `[DONE]`.

Invariant: an event without `"usage"` in its bytes passes untouched and unparsed; a rewritten
event differs only in its `data:` line; a client that asked for usage gets upstream's bytes.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from gateway.audit import sse
from gateway.audit.answer.step import Do, Seen
from gateway.audit.context import AnswerContext
from gateway.audit.usage import cached_tokens, prompt_tokens, total_tokens

_USAGE: Final = b'"usage"'


class Usage:
    __slots__ = ("_asked", "_held", "_hold", "cached_tokens", "prompt_tokens", "total_tokens")

    def __init__(self, ctx: AnswerContext) -> None:
        self._asked = ctx.asked
        self._hold = ctx.observed  # a withheld answer's cached-token count never gets out
        self._held: list[sse.Event] | None = None  # from the first usage event on, when held
        self.prompt_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.total_tokens: int | None = None

    def see(self, event: sse.Event) -> Seen:
        if self._held is not None:
            if event.data == b"[DONE]":
                return event  # the end goes on: what was held goes before it (`done`)
            self._held.append(event)
            return Do.HOLD
        if _USAGE not in event.raw or b'"usage":null' in event.raw:
            return event
        data = event.json()
        if not isinstance(data, dict):
            return event
        if data.get("type") == "response.completed" and isinstance(data.get("response"), dict):
            self._record(data["response"].get("usage"))
            return self._keep(event)
        choices, usage = data.get("choices"), data.get("usage")
        if not isinstance(choices, list) or not isinstance(usage, dict):
            return event
        self._record(usage)
        if not choices:
            return self._keep(event) if self._asked.end else Do.DROP
        if self._asked.chunks:
            return self._keep(event)
        del data["usage"]  # a count the client did not ask for: its chunk goes on without it
        return sse.parse(sse.with_data(event.raw, orjson.dumps(data)))

    def _keep(self, event: sse.Event) -> Seen:
        if not self._hold:
            return event
        self._held = [event]  # and every event after it, until the answer is judged
        return Do.HOLD

    def finish(self) -> list[sse.Event]:
        held, self._held = self._held or [], None
        return held

    def _record(self, usage: Any) -> None:
        self.prompt_tokens = prompt_tokens(usage)
        self.cached_tokens = cached_tokens(usage)
        self.total_tokens = total_tokens(usage)
