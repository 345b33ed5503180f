"""Server-sent events framing, the one place a byte stream is cut into events: LF, CRLF and
lone-CR line ends, comment lines, multi-line `data:`, `event:` names, and a last event that the
end of the stream completes without its blank line.

Invariant: framing never changes a byte: the `raw` bytes of the events read, in order, then the
tail still waiting, are exactly the bytes fed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

import orjson

# Two line ends in a row end an event. A CR is a line end of its own only when the byte after it
# is known and is not LF: a CR last in the buffer waits, it may be the first half of a CRLF.
_EOL: Final = rb"(?:\r\n|\n|\r(?=[^\n]))"
_END: Final = re.compile(_EOL + _EOL)


@dataclass(slots=True)
class Event:
    """One event: `raw`, its bytes as they arrived (its blank line included); `name`, its
    `event:` field (b"" when it has none); `data`, its `data:` lines joined with LF (None when
    it has none: a comment, or an event of other fields only). Never changed once made: a step
    that rewrites an event makes a new one (not frozen only because a frozen dataclass costs
    three times as much to make, once per event)."""

    raw: bytes
    name: bytes
    data: bytes | None

    def json(self) -> Any:
        """The data as JSON; None when there is none or it is not JSON."""
        if self.data is None:
            return None
        try:
            return orjson.loads(self.data)
        except orjson.JSONDecodeError:
            return None


def ends(buf: bytes) -> list[int]:
    """The index just past each complete event in `buf`, in order."""
    if b"\r" in buf:
        return [m.end() for m in _END.finditer(buf)]
    out = []
    at = buf.find(b"\n\n")
    while at >= 0:
        out.append(at + 2)
        at = buf.find(b"\n\n", at + 2)
    return out


def boundary(buf: bytes) -> int:
    """The index just past the last complete event in `buf`, or 0."""
    if b"\r" in buf:
        found = ends(buf)
        return found[-1] if found else 0
    at = buf.rfind(b"\n\n")
    if at < 0:
        return 0
    start = at  # the run of LFs this pair ends: framed forward, its LFs pair up from its start
    while start > 0 and buf[start - 1] == 0x0A:
        start -= 1
    return start + (at + 2 - start) // 2 * 2


def raws(buf: bytes) -> list[bytes]:
    """The events of `buf`, each with its blank line; the bytes after the last complete one,
    if any, are one more event (a stream's last, which its end completes)."""
    out, start = [], 0
    for end in ends(buf):
        out.append(buf[start:end])
        start = end
    if start < len(buf):
        out.append(buf[start:])
    return out


def first(buf: bytes) -> tuple[bytes, bytes] | None:
    """The first complete event (with its blank line) and the bytes after it, or None."""
    if b"\r" in buf:
        found = _END.search(buf)
        cut = found.end() if found is not None else -1
    else:
        at = buf.find(b"\n\n")
        cut = at + 2 if at >= 0 else -1
    return (buf[:cut], buf[cut:]) if cut >= 0 else None


def lines(raw: bytes) -> list[bytes]:
    """An event's lines, without their line ends (a blank line gives an empty one)."""
    return raw.splitlines()


def field(line: bytes) -> tuple[bytes, bytes]:
    """One line's field name and value: one space after the colon is not part of the value; a
    line without a colon is a field with an empty value; a comment's name is empty."""
    name, colon, value = line.partition(b":")
    if colon and value[:1] == b" ":
        value = value[1:]
    return name, value


def parse(raw: bytes) -> Event:
    """One event's fields; comment lines and unknown fields are skipped."""
    one_line = raw.find(b"\n") == len(raw) - 2 and raw[-1:] == b"\n"
    if one_line and raw[:6] == b"data: " and b"\r" not in raw:
        return Event(raw, b"", raw[6:-2])  # one `data:` line then its blank line: most events
    name, data = b"", []
    for line in raw.splitlines():
        key, value = field(line)
        if key == b"data":
            data.append(value)
        elif key == b"event":
            name = value
    return Event(raw, name, b"\n".join(data) if data else None)


def with_data(raw: bytes, data: bytes) -> bytes:
    """One event with `data` as its one `data:` line, where its first was; every other line,
    and every line end, keeps its bytes."""
    out, placed = [], False
    for line in raw.splitlines(keepends=True):
        if field(line.rstrip(b"\r\n"))[0] == b"data":
            if placed:
                continue
            placed, line = True, b"data: " + data + line[len(line.rstrip(b"\r\n")) :]
        out.append(line)
    return b"".join(out)


def events(buf: bytes) -> list[Event]:
    """Every event of `buf` parsed (see `raws`)."""
    if buf.find(b"\n\n") == len(buf) - 2 and b"\r" not in buf:
        return [parse(buf)]  # one LF-framed event: most reads of a token stream
    return [parse(raw) for raw in raws(buf)]


class Reader:
    """Feed a stream's chunks; get back its complete events, whole, as they complete."""

    __slots__ = ("_tail",)

    def __init__(self) -> None:
        self._tail = b""

    def feed(self, chunk: bytes) -> bytes:
        """The events `chunk` completes (with what was waiting before them), as bytes."""
        buf = self._tail + chunk if self._tail else chunk
        cut = boundary(buf)
        self._tail = buf[cut:]
        return buf[:cut]

    def end(self) -> bytes:
        """The stream ended: the bytes still waiting (its last event, without its blank line)."""
        tail, self._tail = self._tail, b""
        return tail
