"""Usage as the audit reads it: the prompt, cached and total tokens of a plain answer, and of a
stream as its events pass (the last usage object any event carried; dropping the usage-only
chat/completions event a client did not ask for; holding, when asked to, every event from the
first that carries usage to the stream's `[DONE]`, until the answer is judged), and what an
answer that ended without its usage is charged instead (`estimate`):

    prompt (as reported, else ceil(request body bytes / 4); nothing when it was never sent)
    + the larger of ceil(answer text bytes / 4) and the stream events the client got
    (at least 1 once the request was sent)

where the answer's text is the UTF-8 bytes of its text fields, plain or streamed alike
(`gateway.verify.scan`).

Invariant: a scanner's output bytes, then `held()`, are its input bytes minus whole dropped
events, in order (held events are the stream's last before `[DONE]`); an event with choices
is never dropped nor rewritten (it keeps a `usage` the client did not ask for).
"""

from __future__ import annotations

import enum
from typing import Any

import orjson

from gateway.audit import sse
from gateway.audit.events import is_done

_USAGE = b'"usage"'


def estimate(prompt: int | None, request_bytes: int, text_bytes: int, events: int) -> int:
    """The tokens charged for a sent request whose answer ended without its usage (the rule
    above): high rather than low."""
    if prompt is None:
        prompt = -(-request_bytes // 4)
    return max(1, prompt + max(events, -(-text_bytes // 4)))


def prompt_tokens(usage: Any) -> int | None:
    """`prompt_tokens` (chat/completions) or `input_tokens` (responses), if reported."""
    if not isinstance(usage, dict):
        return None
    for key in ("prompt_tokens", "input_tokens"):
        if isinstance(usage.get(key), int):
            return int(usage[key])
    return None


def total_tokens(usage: Any) -> int | None:
    """Prompt plus completion tokens (what a tokens-per-minute limit charges), if reported."""
    if not isinstance(usage, dict):
        return None
    if isinstance(usage.get("total_tokens"), int):
        return int(usage["total_tokens"])
    parts = [usage.get(k) for k in ("prompt_tokens", "completion_tokens", "input_tokens",
                                    "output_tokens")]  # fmt: skip
    counted = [p for p in parts if isinstance(p, int)]
    return sum(counted) if counted else None


def parse_usage(body: bytes) -> tuple[Any, Any]:
    """A plain JSON answer parsed (None when it is not JSON), and its usage object."""
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None, None
    return parsed, parsed.get("usage") if isinstance(parsed, dict) else None


def cached_tokens(usage: Any) -> int | None:
    """`cached_tokens` from a chat/completions or responses usage object, if reported."""
    if not isinstance(usage, dict):
        return None
    for details_key in ("prompt_tokens_details", "input_tokens_details"):
        details = usage.get(details_key)
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            return int(details["cached_tokens"])
    return None


class _Step(enum.Enum):
    SEND = "send"
    DROP = "drop"
    HOLD = "hold"


class UsageScanner:
    """Feed upstream chunks; get back what to send the client and learn the usage."""

    __slots__ = ("_held", "_holding", "_reader", "cached_tokens", "drop_usage", "hold",
                 "prompt_tokens", "total_tokens")  # fmt: skip

    def __init__(self, drop_usage: bool, hold: bool = False) -> None:
        """`hold`: usage events wait in `held()` (the detective judges the count first)."""
        self.drop_usage = drop_usage
        self.hold = hold
        self._held: list[bytes] = []
        self._holding = False  # an event was held: the rest up to `[DONE]` waits behind it
        self.cached_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.total_tokens: int | None = None
        self._reader = sse.Reader()

    def feed(self, chunk: bytes) -> bytes:
        """Upstream bytes in; the complete events to send on out."""
        return self._pass(self._reader.feed(chunk))

    def tail(self) -> bytes:
        """The stream ended: what followed its last complete event (a last event without its
        blank line), read like the others."""
        return self._pass(self._reader.end())

    def _pass(self, complete: bytes) -> bytes:
        if not complete or (_USAGE not in complete and not self._holding):
            return complete
        out = []
        for event in sse.raws(complete):
            if self._holding:
                if is_done(event):
                    self._holding = False
                    out.append(event)
                else:
                    self._held.append(event)
                continue
            step = self._consume(event) if _USAGE in event else _Step.SEND
            if step is _Step.HOLD:
                self._holding = True
                self._held.append(event)
            elif step is _Step.SEND:
                out.append(event)
        return b"".join(out)

    def _consume(self, event: bytes) -> _Step:
        """Record usage from one event; what becomes of the event."""
        if b'"usage":null' in event:
            return _Step.SEND
        data = sse.parse(event).json()
        if not isinstance(data, dict):
            return _Step.SEND
        keep = _Step.HOLD if self.hold else _Step.SEND
        if data.get("type") == "response.completed" and isinstance(data.get("response"), dict):
            self._record(data["response"].get("usage"))
            return keep
        choices, usage = data.get("choices"), data.get("usage")
        if not isinstance(choices, list) or not isinstance(usage, dict):
            return _Step.SEND
        self._record(usage)
        return _Step.DROP if self.drop_usage and not choices else keep

    def held(self) -> bytes:
        """The events held back, for the end of an answer that passed its judgement."""
        out, self._held = b"".join(self._held), []
        return out

    def _record(self, usage: Any) -> None:
        self.cached_tokens = cached_tokens(usage)
        self.prompt_tokens = prompt_tokens(usage)
        self.total_tokens = total_tokens(usage)
