"""The server-sent events of a streamed answer as the response side reads them: where a complete
event ends, a stream's first event (where our backend puts its attestation), an event's data,
and the `data: [DONE]` line that ends chat and completions streams; and what of an answer the
client may see of attestations: nothing.

Invariant: framing never changes a byte; attestations are taken out of what the client gets
here and nowhere else (`split_attestation_event` for the stream's first event, `strip_events`
and `strip_body` for anything else, wherever a backend put one), in every audit mode.
"""

from __future__ import annotations

import re
from typing import Any, Final

import orjson

from kvfence.attestation import ATTESTATION_EVENT, ATTESTATION_FIELD

SSE: Final = "text/event-stream"
DONE: Final = b"data: [DONE]"
_EVENT_LINE: Final = b"event: " + ATTESTATION_EVENT.encode()
_FIELD: Final = ATTESTATION_FIELD.encode()
_EVENT_END: Final = re.compile(rb"(\r?\n\r?\n)")


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


def _without(data: Any) -> Any:
    """JSON data without the attestation field, at any depth."""
    if isinstance(data, dict):
        return {k: _without(v) for k, v in data.items() if k != ATTESTATION_FIELD}
    if isinstance(data, list):
        return [_without(v) for v in data]
    return data


def _clean(event: bytes) -> bytes:
    """One event without its attestation event name or field; empty when nothing else is left,
    or when an attestation is in it in a form that cannot be taken out alone."""
    lines = [ln for ln in event.splitlines() if ln.rstrip() != _EVENT_LINE]
    kept = [ln for ln in lines if not ln.startswith(b"data:")]
    if len(kept) < len(lines):
        data = _without(event_data(event))
        if data is None or data == {}:  # not JSON, or nothing but the attestation
            return b""
        kept.append(b"data: " + orjson.dumps(data))
    cleaned = b"\n".join(kept)
    return b"" if _FIELD in cleaned else cleaned


def strip_events(events: bytes) -> bytes:
    """Complete events as the client may have them: an event named for an attestation or
    carrying the attestation field loses both (an event left with nothing is dropped); any
    other event keeps its exact bytes."""
    if _FIELD not in events and _EVENT_LINE not in events:
        return events
    parts = _EVENT_END.split(events)  # event, separator, event, separator, ..., tail
    out = []
    for i in range(0, len(parts), 2):
        event, sep = parts[i], parts[i + 1] if i + 1 < len(parts) else b""
        if _FIELD in event or _EVENT_LINE in event:
            event = _clean(event)
            if not event:
                continue
        out.append(event + sep)
    return b"".join(out)


def strip_body(body: bytes, parsed: Any) -> bytes:
    """A plain answer as the client may have it: its JSON without the attestation field, at
    any depth (`parsed`: the body as JSON, None when it is not); any other body loses the
    lines that hold one. The same bytes when there is none."""
    if _FIELD not in body:
        return body
    if parsed is not None:
        return orjson.dumps(_without(parsed))
    return b"\n".join(ln for ln in body.split(b"\n") if _FIELD not in ln)
