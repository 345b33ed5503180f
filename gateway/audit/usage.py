"""Usage as the audit reads it: the prompt, cached and total tokens of a plain answer, and of a
stream as its events pass (dropping the usage-only chat/completions event a client did not ask
for, and holding every usage event until the answer is judged when asked to).

Invariant: a scanner's output bytes, then `held()`, are its input bytes minus whole dropped
events, in order (held events are the stream's last before `[DONE]`).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.audit.events import event_data, last_boundary

_USAGE = b'"usage"'


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


class UsageScanner:
    """Feed upstream chunks; get back what to send the client and learn `cached_tokens`."""

    __slots__ = ("_buf", "_held", "cached_tokens", "drop_usage", "hold", "prompt_tokens",
                 "total_tokens")  # fmt: skip

    def __init__(self, drop_usage: bool, hold: bool = False) -> None:
        """`hold`: usage events wait in `held()` (the detective judges the count first)."""
        self.drop_usage = drop_usage
        self.hold = hold
        self._held: list[bytes] = []
        self.cached_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.total_tokens: int | None = None
        self._buf = b""

    def feed(self, chunk: bytes) -> bytes:
        buf = self._buf + chunk if self._buf else chunk
        cut = last_boundary(buf)
        complete, self._buf = buf[:cut], buf[cut:]
        if _USAGE not in complete:
            return complete
        out = [ev for ev in complete.split(b"\n\n") if not self._consume(ev)]
        return b"\n\n".join(out)

    def _consume(self, event: bytes) -> bool:
        """Record usage from one event; True when the event is to be dropped."""
        if _USAGE not in event or b'"usage":null' in event:
            return False
        data = event_data(event)
        if not isinstance(data, dict):
            return False
        if data.get("type") == "response.completed" and isinstance(data.get("response"), dict):
            self._record(data["response"].get("usage"))
            return self._keep(event, drop=False)
        if data.get("choices") == [] and isinstance(data.get("usage"), dict):
            self._record(data["usage"])
            return self._keep(event, drop=self.drop_usage)
        return False

    def _keep(self, event: bytes, drop: bool) -> bool:
        """True when the event leaves the output (dropped, or held for later)."""
        if self.hold and not drop:
            self._held.append(event + b"\n\n")
            return True
        return drop

    def held(self) -> bytes:
        """The usage events held back, for the end of an answer that passed its judgement."""
        out, self._held = b"".join(self._held), []
        return out

    def _record(self, usage: Any) -> None:
        self.cached_tokens = cached_tokens(usage)
        self.prompt_tokens = prompt_tokens(usage)
        self.total_tokens = total_tokens(usage)

    def tail(self) -> bytes:
        """Bytes after the last complete event (sent as they are when the stream ends)."""
        tail, self._buf = self._buf, b""
        return tail
