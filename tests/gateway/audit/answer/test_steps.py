"""Each answer step alone, bytes in and bytes out: what it passes, holds, drops or rewrites."""

from __future__ import annotations

import orjson

from gateway.audit import sse
from gateway.audit.answer.attestation import Attestation
from gateway.audit.answer.done import Done
from gateway.audit.answer.fingerprint import Fingerprint
from gateway.audit.answer.markers import Markers
from gateway.audit.answer.step import Do
from gateway.audit.answer.usage import Usage
from gateway.inputs.paths import RESPONSES
from gateway.inputs.stream_options import ask_for_usage, usage_asked
from tests.fakes.openai_upstream import CACHED_TOKENS, sse_events, usage_event
from tests.kit.answer import KEY, context, through

EVENTS = sse_events(include_usage=True)
DONE = b"data: [DONE]\n\n"


def chunk(text: str, usage: object = None, end: bytes = b"\n\n") -> bytes:
    body: dict[str, object] = {"choices": [{"index": 0, "delta": {"content": text}}]}
    if usage is not None:
        body["usage"] = usage
    return b"data: " + orjson.dumps(body) + end


USAGE = {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13}


def test_the_clients_stream_options_are_read_before_the_gateway_adds_its_own() -> None:
    assert not usage_asked({}) and not usage_asked({"stream_options": None})
    assert usage_asked({"stream_options": {"include_usage": True}})
    assert not usage_asked({"stream_options": {"include_usage": False}})
    assert not usage_asked({"stream_options": {"continuous_usage_stats": True}})


def test_the_gateway_asks_for_usage_and_no_per_chunk_usage_the_client_did_not_ask_for() -> None:
    for options, sent in (
        (None, {"include_usage": True}),
        ({"continuous_usage_stats": True}, {"include_usage": True}),
        ({"include_usage": False, "continuous_usage_stats": True}, {"include_usage": True}),
        ({"include_usage": True, "continuous_usage_stats": True},
         {"include_usage": True, "continuous_usage_stats": True}),
    ):  # fmt: skip
        body: dict[str, object] = {"stream": True, "stream_options": options}
        ask_for_usage(body)
        assert body["stream_options"] == sent, options


def test_usage_the_client_asked_for_passes_exactly() -> None:
    stream = [chunk("a", USAGE), chunk("b", USAGE), usage_event(), DONE]
    step = Usage(context(usage_asked=True))
    assert through(step, stream) == b"".join(stream)
    assert step.cached_tokens == CACHED_TOKENS


def test_per_chunk_usage_the_client_did_not_ask_for_is_taken_out_of_its_chunk() -> None:
    crlf = chunk("a", USAGE, end=b"\r\n\r\n")
    named = b"id: 7\nevent: message\n" + chunk("b", USAGE)
    step = Usage(context(usage_asked=False))
    out = through(step, [crlf, named, usage_event(), DONE])
    assert out == chunk("a", end=b"\r\n\r\n") + b"id: 7\nevent: message\n" + chunk("b") + DONE
    assert (step.prompt_tokens, step.cached_tokens) == (12, CACHED_TOKENS)  # still read


def test_a_null_usage_key_is_cut_from_the_bytes_of_a_client_that_did_not_ask() -> None:
    plain = sse_events(include_usage=False)
    for frame in (lambda b: b, lambda b: b.replace(b"\n", b"\r\n")):
        step = Usage(context(usage_asked=False))
        assert through(step, [frame(e) for e in EVENTS]) == b"".join(frame(e) for e in plain)
        assert step.cached_tokens == CACHED_TOKENS
        cut = step.see(sse.parse(frame(EVENTS[0])))
        assert cut == sse.parse(frame(plain[0]))  # its data too, as the steps after it read it
    asked = Usage(context(usage_asked=True))
    assert through(asked, EVENTS) == b"".join(EVENTS)


def test_usage_in_any_other_form_is_parsed_out() -> None:
    spaced = b'data: {"choices": [{"index": 0, "delta": {}}], "usage": null}\n\n'
    first = b'data: {"usage":null,"choices":[{"index":0,"delta":{"content":"usage"}}]}\n\n'
    token = b'data: {"choices":[{"index":0,"text":"\\"usage\\"","logprobs":{"tokens":["usage"]}}]'
    lone_cr = b'data: {"choices":[],"usage":null}\r\r'
    named = b'id: 7\r\ndata: {"choices":[],"usage":null}\r\n\r\n'  # not one line
    step = Usage(context(usage_asked=False))
    out = through(step, [spaced, first, token + b',"usage":null}\n\n', lone_cr, named])
    assert out == (b'data: {"choices":[{"index":0,"delta":{}}]}\n\n'
                   b'data: {"choices":[{"index":0,"delta":{"content":"usage"}}]}\n\n'
                   + token + b"}\n\n" + b'data: {"choices":[]}\r\r'
                   + b'id: 7\r\ndata: {"choices":[]}\r\n\r\n')  # fmt: skip
    untouched = b'data: {"choices":[{"index":0,"text":"\\"usage\\":null"}]}\n\n'
    assert through(Usage(context(usage_asked=False)), [untouched]) == untouched


def test_usage_held_for_the_detective_waits_and_done_goes_on() -> None:
    step = Usage(context("watched", usage_asked=True))
    late = chunk("late")
    seen = [step.see(e) for e in sse.events(b"".join([EVENTS[0], usage_event(), late, DONE]))]
    assert seen[1:3] == [Do.HOLD, Do.HOLD]
    assert [e.raw for e in (seen[0], seen[3]) if isinstance(e, sse.Event)] == [EVENTS[0], DONE]
    assert b"".join(e.raw for e in step.finish()) == usage_event() + late


def test_an_attestation_after_the_first_event_is_counted_and_taken_out() -> None:
    step = Attestation(context("kvfence"))
    late = b'data: {"kvfence_attestation":"x","choices":[]}\r\n\r\n'
    named = b"event: kvfence-attestation\ndata: {}\n\n"
    out = through(step, [EVENTS[0], late, named, EVENTS[1]])
    assert out == EVENTS[0] + b'data: {"choices":[]}\r\n\r\n' + EVENTS[1]
    assert step.late == 2  # the field, then the event name
    unattested = Attestation(context("plain"))
    assert through(unattested, [late]) == b'data: {"choices":[]}\r\n\r\n'
    assert unattested.late == 0  # taken out, not counted: only ours attests


def test_marker_text_split_across_events_is_held_then_found() -> None:
    marker = KEY.mint()
    first, second = chunk("see " + marker[:10]), chunk(marker[10:] + " end")
    step = Markers(context())
    assert step.see(sse.parse(first)) is Do.HOLD
    passed = step.see(sse.parse(second))
    assert isinstance(passed, tuple) and [e.raw for e in passed] == [first, second]
    assert step.scan.markers == 1
    ended = Markers(context())
    assert through(ended, [first]) == first  # the stream ended: what was held goes on


def test_done_goes_last_and_says_the_stream_ended() -> None:
    step = Done(context())
    after = chunk("after")
    assert through(step, [EVENTS[0], DONE, after]) == EVENTS[0] + after + DONE
    assert step.ended
    responses = Done(context(path=RESPONSES))
    final = b'event: response.completed\r\ndata: {"type":"response.completed"}\r\n\r\n'
    assert through(responses, [final, after]) == after + final and responses.ended


FP = b'"system_fingerprint":"vllm-0.32.0-ed28fcd3"'


def finish(index: int, fingerprint: bool = False) -> bytes:
    """vLLM's finish chunk for choice `index`: with the fingerprint when sent direct."""
    body = b'{"id":"cmpl-1","choices":[{"index":%d,"text":"!","finish_reason":"length"}]' % index
    return b"data: " + body + (b"," + FP if fingerprint else b"") + b"}\n\n"


USAGE_ONLY = b'data: {"id":"cmpl-1","choices":[],"usage":{"total_tokens":6},' + FP + b"}\n\n"


def test_the_fingerprint_goes_back_on_the_finish_chunks_vllm_would_have_put_it_on() -> None:
    step = Fingerprint(context(usage_asked=False))
    text = chunk("a")
    assert step.see(sse.parse(text)) == sse.parse(text)  # not a finish chunk: passes at once
    assert step.see(sse.parse(finish(0))) is Do.HOLD
    assert step.see(sse.parse(finish(1))) is Do.HOLD  # n=2, both done at once
    passed = step.see(sse.parse(USAGE_ONLY))
    assert isinstance(passed, tuple)
    assert [e.raw for e in passed] == [finish(0, True), finish(1, True), USAGE_ONLY]
    crlf = Fingerprint(context(usage_asked=False))
    framed = [e.replace(b"\n", b"\r\n") for e in (finish(0), USAGE_ONLY, DONE)]
    assert through(crlf, framed) == b"".join(
        e.replace(b"\n", b"\r\n") for e in (finish(0, True), USAGE_ONLY, DONE)
    )


def test_a_finish_chunk_waits_for_one_event_only() -> None:
    step = Fingerprint(context(usage_asked=False))
    later = chunk("b")  # another choice goes on: the finished one goes first, as it came
    stream = [finish(0), later, finish(1), DONE]
    assert through(step, stream) == b"".join(stream)
    ended = Fingerprint(context(usage_asked=False))
    assert through(ended, [finish(0)]) == finish(0)  # the stream ended: it goes on


def test_no_fingerprint_is_moved_for_a_client_that_asked_or_a_chunk_that_has_one() -> None:
    asked = Fingerprint(context(usage_asked=True))
    assert asked.see(sse.parse(finish(0))) == sse.parse(finish(0))
    stamped = Fingerprint(context(usage_asked=False))
    assert stamped.see(sse.parse(finish(0, True))) == sse.parse(finish(0, True))
    bare = b'data: {"id":"cmpl-1","choices":[],"usage":{"total_tokens":6}}\n\n'
    assert through(Fingerprint(context(usage_asked=False)), [finish(0), bare]) == finish(0) + bare
