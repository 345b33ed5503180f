"""The incremental usage scanner, whatever the chunk boundaries."""

import itertools

import orjson
from hypothesis import given
from hypothesis import strategies as st

from tests.fakes.openai_upstream import CACHED_TOKENS, sse_events
from tests.kit.answer import UsageScanner

EVENTS = sse_events(include_usage=True)  # every chunk with `"usage":null`, then usage, [DONE]
STREAM = b"".join(EVENTS)
PLAIN = sse_events(include_usage=False)  # the same stream as a client that did not ask gets it


def _run(cuts: list[int], drop: bool) -> tuple[bytes, int | None]:
    scanner = UsageScanner(drop_usage=drop)
    points = sorted({c % (len(STREAM) + 1) for c in cuts} | {0, len(STREAM)})
    out = b"".join(scanner.feed(STREAM[a:b]) for a, b in itertools.pairwise(points))
    return out + scanner.tail(), scanner.cached_tokens


@given(st.lists(st.integers(min_value=0), max_size=12))
def test_drops_exactly_the_usage_the_client_did_not_ask_for(cuts: list[int]) -> None:
    out, cached = _run(cuts, drop=True)
    assert out == b"".join(PLAIN)
    assert cached == CACHED_TOKENS


@given(st.lists(st.integers(min_value=0), max_size=12))
def test_keeps_everything_when_asked(cuts: list[int]) -> None:
    out, cached = _run(cuts, drop=False)
    assert out == STREAM and cached == CACHED_TOKENS


def test_responses_api_usage_is_read() -> None:
    scanner = UsageScanner(drop_usage=False)  # the gateway asks a Responses stream nothing extra
    event = (
        b'event: response.completed\ndata: {"type":"response.completed","response":'
        b'{"usage":{"input_tokens":5,"input_tokens_details":{"cached_tokens":4}}}}\n\n'
    )
    assert scanner.feed(event) == event
    assert scanner.cached_tokens == 4


def _crlf(event: bytes) -> bytes:
    return event.replace(b"\n", b"\r\n")


def _split_everywhere(
    stream: bytes, drop: bool, hold: bool = False
) -> list[tuple[bytes, UsageScanner]]:
    """For every cut point: what a scanner fed `stream` in two chunks cut there, then its end,
    handed on, and the scanner."""
    runs = []
    for cut in range(len(stream) + 1):
        scanner = UsageScanner(drop_usage=drop, hold=hold)
        out = scanner.feed(stream[:cut]) + scanner.feed(stream[cut:]) + scanner.tail()
        runs.append((out, scanner))
    return runs


def _usage(scanner: UsageScanner) -> tuple[int | None, int | None, int | None]:
    return scanner.prompt_tokens, scanner.cached_tokens, scanner.total_tokens


def test_a_crlf_stream_has_its_usage_read_and_its_usage_event_dropped() -> None:
    events = [_crlf(e) for e in EVENTS]
    stream = b"".join(events)
    for out, scanner in _split_everywhere(stream, drop=True):
        assert out == b"".join(_crlf(e) for e in PLAIN)
        assert _usage(scanner) == (12, CACHED_TOKENS, 15)
    for out, scanner in _split_everywhere(stream, drop=False):
        assert out == stream and _usage(scanner) == (12, CACHED_TOKENS, 15)


def test_a_lone_cr_stream_has_its_usage_read_and_its_usage_event_dropped() -> None:
    events = [e.replace(b"\n", b"\r") for e in EVENTS]
    scanner = UsageScanner(drop_usage=True)
    out = b"".join(scanner.feed(e) for e in events) + scanner.tail()
    assert out == b"".join(e.replace(b"\n", b"\r") for e in PLAIN)
    assert _usage(scanner) == (12, CACHED_TOKENS, 15)


LAST = {"choices": [{"index": 0, "delta": {"content": "!"}, "finish_reason": "stop"}]}


def _with_usage_on_the_last_text_chunk() -> list[bytes]:
    usage = {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}
    return [*PLAIN[:-2], b"data: " + orjson.dumps({**LAST, "usage": usage}) + b"\n\n", PLAIN[-1]]


def test_usage_on_the_last_chunk_with_choices_is_recorded_and_the_chunk_kept() -> None:
    events = _with_usage_on_the_last_text_chunk()
    stream = b"".join(events)
    for out, scanner in _split_everywhere(stream, drop=False):
        assert out == stream  # an event with choices is never dropped
        assert _usage(scanner) == (9, None, 12)
    without = b"".join([*PLAIN[:-2], b"data: " + orjson.dumps(LAST) + b"\n\n", PLAIN[-1]])
    for out, scanner in _split_everywhere(stream, drop=True):
        assert out == without  # read, then taken out of the chunk
        assert _usage(scanner) == (9, None, 12)


def test_held_events_keep_their_order_up_to_done() -> None:
    events = _with_usage_on_the_last_text_chunk()
    stream = b"".join(events)
    for out, scanner in _split_everywhere(stream, drop=False, hold=True):
        assert out == b"".join(events[:-2] + events[-1:])  # the usage chunk waits, [DONE] passes
        assert scanner.held() == events[-2] and scanner.total_tokens == 12
    late = b'data: {"choices":[{"index":0,"delta":{"content":"late"}}]}\n\n'
    scanner = UsageScanner(drop_usage=False, hold=True)
    out = scanner.feed(b"".join(EVENTS[:-1]) + late + EVENTS[-1]) + scanner.tail()
    assert out == b"".join(EVENTS[:-2]) + EVENTS[-1]  # what followed the usage waits behind it
    assert scanner.held() == EVENTS[-2] + late


def test_the_last_event_without_its_blank_line_is_read() -> None:
    usage_only = EVENTS[-2].rstrip(b"\n")  # a stream that ends with its usage, unended
    stream = b"".join(EVENTS[:-2]) + usage_only
    for drop, expected in ((True, b"".join(PLAIN[:-1])), (False, stream)):
        for out, scanner in _split_everywhere(stream, drop=drop):
            assert out == expected
            assert _usage(scanner) == (12, CACHED_TOKENS, 15)


def test_comments_and_multi_line_data_are_read() -> None:
    body = orjson.dumps(orjson.loads(EVENTS[-2][6:]), option=orjson.OPT_INDENT_2)
    usage = b": usage follows\r\n" + b"".join(b"data: " + ln + b"\r\n" for ln in body.split(b"\n"))
    stream = b"".join(EVENTS[:-2]) + usage + b"\r\n" + EVENTS[-1]
    for out, scanner in _split_everywhere(stream, drop=True):
        assert out == b"".join(PLAIN)
        assert _usage(scanner) == (12, CACHED_TOKENS, 15)
