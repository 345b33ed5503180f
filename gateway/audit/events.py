"""The server-sent events of a streamed answer as the response side reads them (framed by
`gateway.audit.sse`): a stream's first event (where our backend puts its attestation), the
`data: [DONE]` event that ends chat and completions streams; and what of an answer the client
may see of attestations: nothing.

Invariant: framing never changes a byte; attestations are taken out of what the client gets
here and nowhere else (`split_attestation_event` for the stream's first event, `strip_events`
and `strip_body` for anything else, wherever a backend put one), in every audit mode.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from gateway.audit import sse
from kvfence.attestation import ATTESTATION_EVENT, ATTESTATION_FIELD

SSE: Final = "text/event-stream"
_DONE: Final = b"[DONE]"
_NAME: Final = ATTESTATION_EVENT.encode()
_FIELD: Final = ATTESTATION_FIELD.encode()


def split_attestation_event(event: bytes) -> tuple[str | None, bytes]:
    """From the stream's first event (with its blank line): the attestation token (None when
    the event is not the attestation event) and the bytes to send the client instead: the
    same bytes, or, from the attestation event, its data without the attestation field and
    without the event name."""
    parsed = sse.parse(event)
    data = parsed.json()
    if not isinstance(data, dict) or ATTESTATION_FIELD not in data:
        return None, event
    token = data.pop(ATTESTATION_FIELD)
    clean = b"data: " + orjson.dumps(data) + b"\n\n"
    named = parsed.name.rstrip() == _NAME
    return (token if named and isinstance(token, str) else None), clean


def is_done(event: bytes) -> bool:
    """The event is `data: [DONE]`, the last of a chat or completions stream."""
    return _DONE in event and sse.parse(event).data == _DONE


def done_at(events: bytes) -> int:
    """Where the `data: [DONE]` event starts in `events`, or -1."""
    if _DONE not in events:
        return -1
    at = 0
    for event in sse.raws(events):
        if is_done(event):
            return at
        at += len(event)
    return -1


def _without(data: Any) -> Any:
    """JSON data without the attestation field, at any depth."""
    if isinstance(data, dict):
        return {k: _without(v) for k, v in data.items() if k != ATTESTATION_FIELD}
    if isinstance(data, list):
        return [_without(v) for v in data]
    return data


def _is_name(line: bytes) -> bool:
    key, value = sse.field(line)
    return key == b"event" and value.rstrip() == _NAME


def _clean(event: bytes) -> bytes:
    """One event without its attestation event name or field; empty when nothing else is left,
    or when an attestation is in it in a form that cannot be taken out alone."""
    body = event.rstrip(b"\r\n")
    lines = [ln for ln in sse.lines(body) if not _is_name(ln)]
    kept = [ln for ln in lines if sse.field(ln)[0] != b"data"]
    if len(kept) < len(lines):
        data = _without(sse.parse(body).json())
        if data is None or data == {}:  # not JSON, or nothing but the attestation
            return b""
        kept.append(b"data: " + orjson.dumps(data))
    cleaned = b"\n".join(kept)
    if _FIELD in cleaned or not cleaned:
        return b""
    return cleaned + event[len(body) :]


def strip_events(events: bytes) -> bytes:
    """Complete events as the client may have them: an event named for an attestation or
    carrying the attestation field loses both (an event left with nothing is dropped); any
    other event keeps its exact bytes."""
    if _FIELD not in events and _NAME not in events:
        return events
    out = []
    for event in sse.raws(events):
        if _FIELD in event or _NAME in event:
            event = _clean(event)
            if not event:
                continue
        out.append(event)
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
