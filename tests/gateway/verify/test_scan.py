"""Scanning answers as they pass: a canary marker that one choice of an n > 1 stream writes in
pieces is found even when other choices' events come between them, and such an answer's text
is not kept for the history."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.inputs.paths import CHAT
from gateway.verify.markers import MarkerKey
from gateway.verify.scan import AnswerScan

KEY = MarkerKey(b"k" * 32)


def event(index: int, text: str) -> bytes:
    choice: dict[str, Any] = {"index": index, "delta": {"content": text}, "finish_reason": None}
    return b"data: " + orjson.dumps({"object": "chat.completion.chunk", "choices": [choice]})


def test_a_marker_split_within_one_choice_is_found_between_other_choices() -> None:
    marker = KEY.mint()
    half = len(marker) // 2
    pieces = [(1, "see " + marker[:half]), (0, "unrelated words"), (1, marker[half:] + " end")]
    together = AnswerScan(KEY, CHAT)
    together.events(b"\n\n".join(event(i, t) for i, t in pieces) + b"\n\n")
    apart = AnswerScan(KEY, CHAT)
    for index, text in pieces:  # one event per read, \r\n-framed
        apart.events(event(index, text) + b"\r\n\r\n")
    assert together.markers == apart.markers == 1
    assert together.text is None  # several choices: no history text


def test_the_start_of_a_marker_in_one_choice_holds_the_stream_back() -> None:
    scan = AnswerScan(KEY, CHAT)
    scan.events(event(2, "text then " + KEY.mint()[:8]) + b"\n\n")
    scan.events(event(0, "other text") + b"\n\n")
    assert scan.marker_started and scan.markers == 0


def test_a_one_choice_answer_keeps_its_text() -> None:
    scan = AnswerScan(KEY, CHAT)
    scan.events(event(0, "Hello") + b"\n\n" + event(0, " there") + b"\n\n")
    assert scan.text == "Hello there" and scan.markers == 0
