"""The incremental usage scanner, whatever the chunk boundaries."""

import itertools

from hypothesis import given
from hypothesis import strategies as st

from gateway.audit.usage import UsageScanner
from tests.fakes.openai_upstream import CACHED_TOKENS, sse_events

EVENTS = sse_events(include_usage=True)
STREAM = b"".join(EVENTS)


def _run(cuts: list[int], drop: bool) -> tuple[bytes, int | None]:
    scanner = UsageScanner(drop_usage=drop)
    points = sorted({c % (len(STREAM) + 1) for c in cuts} | {0, len(STREAM)})
    out = b"".join(scanner.feed(STREAM[a:b]) for a, b in itertools.pairwise(points))
    return out + scanner.tail(), scanner.cached_tokens


@given(st.lists(st.integers(min_value=0), max_size=12))
def test_drops_exactly_the_usage_event(cuts: list[int]) -> None:
    out, cached = _run(cuts, drop=True)
    assert out == b"".join(EVENTS[:-2] + EVENTS[-1:])
    assert cached == CACHED_TOKENS


@given(st.lists(st.integers(min_value=0), max_size=12))
def test_keeps_everything_when_asked(cuts: list[int]) -> None:
    out, cached = _run(cuts, drop=False)
    assert out == STREAM and cached == CACHED_TOKENS


def test_responses_api_usage_is_read() -> None:
    scanner = UsageScanner(drop_usage=True)
    event = (
        b'event: response.completed\ndata: {"type":"response.completed","response":'
        b'{"usage":{"input_tokens":5,"input_tokens_details":{"cached_tokens":4}}}}\n\n'
    )
    assert scanner.feed(event) == event
    assert scanner.cached_tokens == 4
