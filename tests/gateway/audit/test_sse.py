"""SSE framing, bytes in, events out: every line-end style the spec allows reads the same,
comments and multi-line data are read as the spec says, any chunking gives the same events with
the same bytes, and a stream's last event needs no blank line."""

from __future__ import annotations

import pytest

from gateway.audit.events import done_at, is_done
from gateway.audit.sse import Event, Reader, events, parse, raws

LF = b': keep-alive\n\nevent: note\ndata: first\ndata: second\n\ndata: {"a":1}\n\ndata: [DONE]\n\n'
ENDINGS = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}


def framed(ending: bytes) -> bytes:
    return LF.replace(b"\n", ending)


def read(stream: bytes, cuts: list[int]) -> list[bytes]:
    """The raw events a reader hands out when `stream` arrives cut at `cuts`, its end included."""
    reader, out, start = Reader(), [], 0
    for cut in [*cuts, len(stream)]:
        out += raws(reader.feed(stream[start:cut]))
        start = cut
    tail = reader.end()
    return out + ([tail] if tail else [])


@pytest.mark.parametrize("ending", ENDINGS.values(), ids=ENDINGS.keys())
def test_every_line_end_reads_the_same_events(ending: bytes) -> None:
    got = events(framed(ending))
    assert [(e.name, e.data) for e in got] == [
        (b"", None),  # a comment: no data, nothing to read
        (b"note", b"first\nsecond"),
        (b"", b'{"a":1}'),
        (b"", b"[DONE]"),
    ]
    assert got[2].json() == {"a": 1} and got[1].json() is None
    assert b"".join(e.raw for e in got) == framed(ending)


@pytest.mark.parametrize("ending", ENDINGS.values(), ids=ENDINGS.keys())
def test_any_chunking_gives_the_same_events_and_bytes(ending: bytes) -> None:
    stream = framed(ending)
    whole = raws(stream)
    assert len(whole) == 4
    for cut in range(len(stream) + 1):
        assert read(stream, [cut]) == whole, cut
    for a in range(0, len(stream) + 1, 3):  # two cuts: a CRLF may be cut between CR and LF
        for b in range(a, len(stream) + 1, 5):
            assert read(stream, [a, b]) == whole, (a, b)


@pytest.mark.parametrize("ending", ENDINGS.values(), ids=ENDINGS.keys())
def test_one_event_alone_reads_as_it_does_among_others(ending: bytes) -> None:
    stream = framed(ending)
    whole = events(stream)
    at = 0
    for event in whole:  # each event alone, and every run of events, as a reader hands them out
        assert events(event.raw) == [event]
        assert events(stream[at:]) == whole[whole.index(event) :]
        at += len(event.raw)
    # Not one event: blank lines after it, or text after its blank line.
    assert [e.raw for e in events(b"data: x\n\n\n\n")] == [b"data: x\n\n", b"\n\n"]
    assert [e.raw for e in events(b"data: x\n\ndata: y")] == [b"data: x\n\n", b"data: y"]


def test_a_cr_last_in_a_chunk_waits_for_the_next_byte() -> None:
    reader = Reader()
    assert reader.feed(b"data: x\r\n\r") == b""  # the CR may be half of a CRLF
    assert reader.feed(b"\ndata: y\r\n\r\n") == b"data: x\r\n\r\ndata: y\r\n\r\n"


def test_the_last_event_needs_no_blank_line() -> None:
    reader = Reader()
    assert reader.feed(b"data: a\n\ndata: [DONE]\n") == b"data: a\n\n"
    last = reader.end()
    assert last == b"data: [DONE]\n" and is_done(last)
    assert reader.end() == b""


def test_fields_as_the_spec_reads_them() -> None:
    event = parse(b"event:name\ndata\ndata:  two spaces\n: data: a comment\nid: 7\n\n")
    assert event == Event(event.raw, b"name", b"\n two spaces")


@pytest.mark.parametrize("ending", ENDINGS.values(), ids=ENDINGS.keys())
def test_done_is_found_whatever_the_framing(ending: bytes) -> None:
    stream = framed(ending)
    at = done_at(stream)
    assert stream[at:] == b"data: [DONE]" + ending * 2
    assert done_at(b'data: {"text":"data: [DONE]"}' + ending * 2) == -1
