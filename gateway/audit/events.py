"""The server-sent events of a streamed answer as the response side reads them: where a complete
event ends, a stream's first event (where our backend puts its attestation), an event's data,
and the `data: [DONE]` line that ends chat and completions streams.

Invariant: framing never changes a byte; `split_attestation_event` is the one place the
attestation field is taken out of what the client gets.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from kvfence.attestation import ATTESTATION_EVENT, ATTESTATION_FIELD

SSE: Final = "text/event-stream"
DONE: Final = b"data: [DONE]"
_EVENT_LINE: Final = b"event: " + ATTESTATION_EVENT.encode()


def first_event(buf: bytes) -> tuple[bytes, bytes] | None:
    """The first complete event (without its blank line) and the bytes after it, or None."""
    ends = [(i, n) for i, n in ((buf.find(b"\n\n"), 2), (buf.find(b"\r\n\r\n"), 4)) if i >= 0]
    if not ends:
        return None
    index, width = min(ends)
    return buf[:index], buf[index + width :]


def last_boundary(buf: bytes) -> int:
    """Index just past the last complete event, or 0."""
    lf, crlf = buf.rfind(b"\n\n"), buf.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def event_data(event: bytes) -> Any:
    """An event's `data:` lines as JSON, or None."""
    lines = [ln[5:].lstrip(b" ") for ln in event.splitlines() if ln.startswith(b"data:")]
    try:
        return orjson.loads(b"\n".join(lines)) if lines else None
    except orjson.JSONDecodeError:
        return None


def split_attestation_event(event: bytes) -> tuple[str | None, bytes]:
    """From the stream's first event: the attestation token (None when the event is not the
    attestation event) and the bytes to send the client instead: the same chunk without the
    attestation field and without the event name."""
    lines = event.splitlines()
    named = any(line.rstrip() == _EVENT_LINE for line in lines)
    data = event_data(event)
    if not isinstance(data, dict) or ATTESTATION_FIELD not in data:
        return None, event + b"\n\n"
    token = data.pop(ATTESTATION_FIELD)
    clean = b"data: " + orjson.dumps(data) + b"\n\n"
    return (token if named and isinstance(token, str) else None), clean


def done_at(events: bytes) -> int:
    """Where a `data: [DONE]` line starts in complete events, or -1 (text inside a JSON string
    never follows a raw newline, so it cannot match)."""
    at = events.find(DONE)
    while at > 0 and events[at - 1 : at] != b"\n":
        at = events.find(DONE, at + 1)
    return at
