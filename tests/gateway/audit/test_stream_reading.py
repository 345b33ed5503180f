"""A stream as the response side reads it, whatever its framing and wherever its chunks are
cut: a canary marker is found, and the text an answer without usage is charged for is the same
as for the same answer sent plain."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.audit.usage import estimate
from gateway.inputs.paths import CHAT
from gateway.verify.markers import MarkerKey
from gateway.verify.scan import AnswerScan
from tests.kit.answer import UsageScanner

KEY = MarkerKey(b"k" * 32)
ENDINGS = {"lf": b"\n\n", "crlf": b"\r\n\r\n", "cr": b"\r\r"}


def chunk(text: str) -> bytes:
    choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    return b"data: " + orjson.dumps({"object": "chat.completion.chunk", "choices": [choice]})


def scanned(stream: bytes, cut: int) -> AnswerScan:
    usage, scan = UsageScanner(drop_usage=True), AnswerScan(KEY, CHAT)
    for part in (stream[:cut], stream[cut:]):
        scan.events(usage.feed(part))
    scan.events(usage.tail())
    return scan


@pytest.mark.parametrize("end", ENDINGS.values(), ids=ENDINGS.keys())
def test_a_marker_is_found_at_every_cut(end: bytes) -> None:
    marker = KEY.mint()
    half = len(marker) // 2
    stream = end.join([chunk("see " + marker[:half]), chunk(marker[half:] + " end"),
                       b"data: [DONE]"]) + end  # fmt: skip
    for cut in range(len(stream) + 1):
        assert scanned(stream, cut).markers == 1, cut


def test_streamed_and_plain_text_are_counted_alike() -> None:
    words = ["Héllo", " there", "\n!"]
    stream = b"".join(chunk(w) + b"\r\n\r\n" for w in words) + b"data: [DONE]"  # unended
    plain = orjson.dumps({"choices": [{"index": 0, "message": {"content": "".join(words)}}]})
    body = AnswerScan(KEY, CHAT)
    body.body(plain, orjson.loads(plain))
    size = len("".join(words).encode())
    for cut in range(len(stream) + 1):
        assert scanned(stream, cut).text_bytes == body.text_bytes == size


def test_the_estimate_charges_prompt_and_text_rounded_up() -> None:
    assert estimate(None, 41, 9, 0) == 11 + 3  # ceil(41 / 4) + ceil(9 / 4)
    assert estimate(None, 41, 9, 5) == 11 + 5  # one per event the client got, when more
    assert estimate(20, 41, 0, 0) == 20  # the prompt as reported
    assert estimate(None, 0, 0, 0) == 1  # never nothing
