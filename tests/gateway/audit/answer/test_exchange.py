"""The exchange as a whole, bytes in and bytes out, without aiohttp: the orders that matter
(marker text split across events, an attestation in a late event, usage before `[DONE]`, no
ending event before the receipt is stored), whatever the framing and wherever the chunks are
cut."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from gateway.audit.context import AnswerContext
from gateway.audit.replies import Withheld
from gateway.errors import AttestationRefused, ReceiptUnavailable, UpstreamUnavailable
from gateway.inputs.paths import COMPLETIONS, RESPONSES
from gateway.receipts.draft import Draft
from kvfence.verdict import Verdict
from tests.fakes.openai_upstream import CACHED_TOKENS, sse_events, usage_event
from tests.kit.answer import KEY, Ledger, attestation_event, context, cuts, exchange_from_bytes

EVENTS = sse_events(include_usage=True)
STREAM = b"".join(EVENTS)
PLAIN = b"".join(sse_events(include_usage=False))  # what a client that did not ask gets


def crlf(data: bytes) -> bytes:
    return data.replace(b"\n", b"\r\n")


@pytest.mark.parametrize("frame", [lambda b: b, crlf], ids=["lf", "crlf"])
async def test_a_stream_passes_with_its_usage_read_and_the_unasked_usage_taken_out(
    frame: object,
) -> None:
    stream = frame(STREAM)  # type: ignore[operator]
    expected = frame(PLAIN)  # type: ignore[operator]
    for cut in range(0, len(stream) + 1, 7):
        run = await exchange_from_bytes(cuts(stream, [cut]), context(usage_asked=False))
        assert run.sent == expected and run.error is None
        assert (run.answer.prompt_tokens, run.answer.cached_tokens) == (12, CACHED_TOKENS)
        [(judgement, status, reason)] = run.ledger.settled
        assert (judgement.verdict, status, reason) == (Verdict.UNATTESTED, None, None)


async def test_a_client_that_asked_gets_upstreams_bytes() -> None:
    run = await exchange_from_bytes(cuts(crlf(STREAM), [5, 90]), context(usage_asked=True))
    assert run.sent == crlf(STREAM)


async def test_usage_held_for_the_detective_goes_before_done(tmp_path: Path) -> None:
    ctx = context("watched", usage_asked=True, history=tmp_path / "h.bin")
    run = await exchange_from_bytes(cuts(STREAM, [40, 200]), ctx)
    assert run.sent == STREAM  # held until judged, then in upstream's order, `[DONE]` last
    assert run.answer.total_tokens == 15


async def test_marker_text_split_across_events_withholds_the_rest() -> None:
    marker = KEY.mint()
    text = [b'data: {"choices":[{"index":0,"delta":{"content":"' + t.encode() + b'"}}]}\n\n'
            for t in ("fine. ", "see " + marker[:12], marker[12:])]  # fmt: skip
    run = await exchange_from_bytes([*text, b"data: [DONE]\n\n"], context())
    assert run.sent == text[0]  # the marker's first half never left; the relay ends with an error
    assert isinstance(run.error, AttestationRefused)
    assert run.ledger.settled[0][0].verdict is Verdict.VIOLATION


async def test_an_attestation_in_a_late_event_withholds_the_rest() -> None:
    late = b'data: {"kvfence_attestation":"forged"}\r\n\r\n'
    events = [EVENTS[0], late, EVENTS[1], EVENTS[-1]]
    run = await exchange_from_bytes(events, context("kvfence"), first=attestation_event())
    assert isinstance(run.error, AttestationRefused)
    assert b"kvfence" not in run.sent and b"[DONE]" not in run.sent
    assert run.sent == b"data: {}\n\n" + EVENTS[0]  # the first event without its attestation
    assert run.ledger.settled[0][0].verdict is Verdict.INVALID


async def test_an_attested_stream_loses_its_attestation_and_is_judged_clean() -> None:
    stream = b"".join(sse_events(include_usage=False)[:-1]) + usage_event(3) + EVENTS[-1]
    run = await exchange_from_bytes(cuts(crlf(stream), [33]), context("kvfence", usage_asked=False),
                                    first=attestation_event(cached=CACHED_TOKENS))  # fmt: skip
    assert b"kvfence" not in run.sent and run.sent.endswith(b"data: [DONE]\r\n\r\n")
    assert run.ledger.opened and run.ledger.settled[0][0].verdict is Verdict.CLEAN


async def test_a_stream_without_its_attestation_is_withheld_before_its_first_byte() -> None:
    run = await exchange_from_bytes([STREAM], context("kvfence"), first=EVENTS[0])
    assert isinstance(run.head, Withheld) and run.sent == b""
    assert run.ledger.opened == [] and run.ledger.settled[0][0].verdict is Verdict.MISSING


async def test_a_stream_cut_before_done_is_an_error_not_an_answer() -> None:
    run = await exchange_from_bytes([b"".join(EVENTS[:2])], context())
    assert isinstance(run.error, UpstreamUnavailable)
    assert run.sent.startswith(b"".join(EVENTS[:2])) and b"[DONE]" not in run.sent
    assert run.answer.estimated_tokens > 0  # charged what it is known to have cost


async def test_the_last_event_without_its_blank_line_still_ends_the_stream() -> None:
    run = await exchange_from_bytes([STREAM.rstrip(b"\n")], context())
    assert run.error is None and run.sent == STREAM.rstrip(b"\n")


def losing_its_receipt(ctx: AnswerContext) -> AnswerContext:
    """`ctx` whose ledger settles, then raises as a lost receipt does."""
    lost = ReceiptUnavailable("receipt rcpt_1_00 could not be stored")
    return dataclasses.replace(ctx, ledger=Ledger(lost=lost))


async def test_a_stream_whose_receipt_is_lost_gets_no_ending_event() -> None:
    final = b'event: response.completed\ndata: {"type":"response.completed"}\n\n'
    text = b'event: response.output_text.delta\ndata: {"delta":"hi"}\n\n'
    chat, responses = context(), context(path=RESPONSES)
    for ctx, stream, end in [(chat, STREAM, b"[DONE]"), (responses, text + final, b"completed")]:
        run = await exchange_from_bytes(cuts(stream, [len(stream) - 5]), losing_its_receipt(ctx))
        assert isinstance(run.error, ReceiptUnavailable) and end not in run.sent
        assert run.sent and stream.startswith(run.sent)  # what came before the end went out


async def test_a_stream_cut_short_whose_receipt_is_lost_ends_saying_the_receipt_is_lost() -> None:
    run = await exchange_from_bytes([b"".join(EVENTS[:2])], losing_its_receipt(context()))
    assert isinstance(run.error, ReceiptUnavailable)  # not the upstream's error it settled with
    assert run.ledger.settled[0][1:] == (502, "upstream_unavailable")


FP = b',"system_fingerprint":"vllm-0.32.0-ed28fcd3"'
HEAD = b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"smollm2","choices":'


def _vllm(text: bytes, finish: bytes = b"null", fp: bool = False, usage: bytes = b"") -> bytes:
    choice = b'[{"index":0,"text":"%s","logprobs":null,"finish_reason":%s}]' % (text, finish)
    return HEAD + choice + (b',"usage":' + usage if usage else b"") + (FP if fp else b"") + b"}\n\n"


def _counts(n: int) -> bytes:
    return b'{"prompt_tokens":3,"total_tokens":%d,"completion_tokens":%d}' % (3 + n, n)


END = b"data: [DONE]\n\n"
USAGE_ONLY = (
    HEAD + b'[],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,'
    b'"prompt_tokens_details":{"cached_tokens":2}}' + FP + b"}\n\n"
)
# vLLM 0.32 sent the same completion direct (the client asked for no usage) and to the gateway,
# which asked for usage: the fingerprint then rides the usage-only event, not the finish chunk.
DIRECT = _vllm(b" a") + _vllm(b" sky", b'"length"', fp=True) + END
UPSTREAM = _vllm(b" a") + _vllm(b" sky", b'"length"') + USAGE_ONLY + END
# A server that sends per-chunk usage anyway (vLLM's continuous_usage_stats).
CONTINUOUS = (_vllm(b" a", usage=_counts(1)) + _vllm(b" sky", b'"length"', usage=_counts(2))
              + USAGE_ONLY + END)  # fmt: skip


@pytest.mark.parametrize("frame", [lambda b: b, crlf], ids=["lf", "crlf"])
@pytest.mark.parametrize("upstream", [UPSTREAM, CONTINUOUS], ids=["usage", "continuous"])
async def test_a_client_that_did_not_ask_gets_the_stream_vllm_sends_it_direct(
    frame: object, upstream: bytes
) -> None:
    stream, expected = frame(upstream), frame(DIRECT)  # type: ignore[operator]
    for cut in range(0, len(stream) + 1, 11):
        ctx = context(path=COMPLETIONS, usage_asked=False)
        run = await exchange_from_bytes(cuts(stream, [cut]), ctx)
        assert run.sent == expected and run.error is None, cut
        assert (run.answer.prompt_tokens, run.answer.cached_tokens) == (3, 2)  # read first
        assert run.answer.total_tokens == 5


@pytest.mark.parametrize("upstream", [UPSTREAM, CONTINUOUS], ids=["usage", "continuous"])
async def test_a_client_that_asked_gets_vllms_bytes_untouched(upstream: bytes) -> None:
    run = await exchange_from_bytes(cuts(crlf(upstream), [9, 200]), context(path=COMPLETIONS))
    assert run.sent == crlf(upstream) and run.answer.total_tokens == 5


async def test_the_receipt_counts_the_bytes_the_client_got_not_upstreams() -> None:
    draft = Draft("r1", 1, COMPLETIONS, "m", "r", "f", "tenant", None, "1", "vllm", {})
    ctx = dataclasses.replace(context(path=COMPLETIONS, usage_asked=False), receipt=draft)
    run = await exchange_from_bytes(cuts(CONTINUOUS, [40, 300]), ctx)
    assert run.sent == DIRECT
    assert draft.wire.digest() == hashlib.sha256(DIRECT).digest()
