"""The usage step: reads the usage any event carries (the last one counts), keeps from a client
that did not ask for usage (`gateway.inputs.stream_options`) what the gateway asked for itself:
the usage-only event, and every chunk's `usage` key (null, or a count), and, while the detective
judges the answer, holds every event from the first whose usage the client gets to `[DONE]`.

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
_NULL: Final = b'"usage":null'
# A chunk whose usage is null, as OpenAI and earlier vLLM releases write it: the key last, on
# one line.
_NULL_KEY: Final = b',"usage":null'
_NULL_LAST: Final = (_NULL_KEY + b"}\n\n", _NULL_KEY + b"}\r\n\r\n")


class Usage:
    __slots__ = ("_asked", "_held", "_hold", "cached_tokens", "prompt_tokens", "total_tokens")

    def __init__(self, ctx: AnswerContext) -> None:
        self._asked = ctx.usage_asked
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
        raw = event.raw
        if _USAGE not in raw:
            return event
        if not self._asked:
            return self._unasked(event)
        if _NULL in raw:
            return event
        data = event.json()
        if not isinstance(data, dict):
            return event
        if data.get("type") == "response.completed" and isinstance(data.get("response"), dict):
            self._record(data["response"].get("usage"))
            return self._keep(event)
        if not isinstance(data.get("choices"), list) or not isinstance(data.get("usage"), dict):
            return event
        self._record(data["usage"])
        return self._keep(event)

    def _unasked(self, event: sse.Event) -> Seen:
        """Usage the client did not ask for: read, then dropped (the usage-only event) or taken
        out of its chunk. A null last key of a one-line event is cut from its bytes, unparsed."""
        raw, line = event.raw, event.data
        if raw.endswith(_NULL_LAST) and raw[:5] == b"data:" and line is not None:
            at = raw.rindex(_NULL_KEY)
            if raw.find(b"\n", 0, at) < 0 and raw.find(b"\r", 0, at) < 0:  # one `data:` line
                rest = line[: -len(_NULL_KEY) - 1] + b"}"
                if _USAGE not in rest:
                    return sse.Event(raw[:at] + raw[at + len(_NULL_KEY) :], b"", rest)
        data = event.json()
        if not isinstance(data, dict) or "usage" not in data:
            return event
        usage = data.pop("usage")
        if isinstance(usage, dict):
            self._record(usage)
            if data.get("choices") == []:
                return Do.DROP
        return sse.parse(sse.with_data(raw, orjson.dumps(data)))

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
