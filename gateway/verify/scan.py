"""Scanning an answer as it passes: live canary markers in its text (from every backend), the
text itself (for the detective's history), and attestations in later stream events (from ours).

Invariant: a chunk is scanned before it is written to the client, and a marker split across
events is still found; scanning never changes the bytes relayed.
"""

from __future__ import annotations

import re
from typing import Any, Final

import orjson

from gateway.adapters.base import CHAT, COMPLETIONS
from gateway.verify.markers import MarkerKey, MarkerScanner
from kvfence.attestation import ATTESTATION_EVENT, ATTESTATION_FIELD

MAX_TEXT: Final = 1 << 20  # answer text kept for the history; longer answers are not recorded
_STRING = rb'"((?:[^"\\]|\\.)*)"'
_FIELD: Final = {
    CHAT: re.compile(rb'"content":' + _STRING),
    COMPLETIONS: re.compile(rb'"text":' + _STRING),
}
_ANY = re.compile(rb'"(?:content|text|delta|output_text)":' + _STRING)
_LATE = (ATTESTATION_EVENT.encode(), ATTESTATION_FIELD.encode())
_TERMINAL = re.compile(rb'"type":\s*"response\.(?:completed|incomplete|failed)"')


class AnswerScan:
    def __init__(self, markers: MarkerKey | None, path: str, attested: bool) -> None:
        self._scanner = MarkerScanner(markers) if markers is not None else None
        self._field = _FIELD.get(path, _ANY)
        self._keep = path in _FIELD
        self._attested = attested
        self._parts: list[str] = []
        self._size = 0
        self.late_attestations = 0
        self.terminal = False  # a Responses stream's final event was seen

    @property
    def markers(self) -> int:
        return len(self._scanner.found) if self._scanner is not None else 0

    @property
    def marker_started(self) -> bool:
        """The text so far ends with the start of what may be a marker."""
        return self._scanner is not None and self._scanner.started

    @property
    def text(self) -> str | None:
        """The answer's text, when it was short enough to keep."""
        return "".join(self._parts) if self._keep else None

    def _take(self, piece: str) -> None:
        if self._scanner is not None:
            self._scanner.feed(piece)
        if self._keep:
            self._size += len(piece)
            if self._size > MAX_TEXT:
                self._keep, self._parts = False, []
            else:
                self._parts.append(piece)

    def events(self, data: bytes) -> None:
        """Complete stream events, in order, before they are relayed."""
        if b'"response.' in data and _TERMINAL.search(data):
            self.terminal = True
        if self._attested and b"kvfence" in data:
            self.late_attestations += sum(data.count(tag) for tag in _LATE)
        for raw in self._field.findall(data):
            try:
                self._take(orjson.loads(b'"' + raw + b'"'))
            except orjson.JSONDecodeError:
                self._keep = False  # not text we can reproduce: record nothing of it

    def body(self, data: bytes, parsed: Any) -> None:
        """A plain answer: markers anywhere in it, the text of its one choice."""
        if self._scanner is not None:
            self._scanner.feed(data.decode("utf-8", "replace"))
        choices = parsed.get("choices") if isinstance(parsed, dict) else None
        if not self._keep or not isinstance(choices, list) or len(choices) != 1:
            self._keep = False
            return
        choice = choices[0] if isinstance(choices[0], dict) else {}
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else choice.get("text")
        if isinstance(text, str):
            self._parts, self._size = [text], len(text)
        else:
            self._keep = False
