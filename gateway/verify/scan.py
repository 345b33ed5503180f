"""Scanning an answer as it passes: live canary markers in its text (from every backend), the
text itself (for the detective's history) and its size (what an answer without usage is charged
for).

Invariant: a chunk is scanned before it is written to the client, and a marker split across
events is still found, also when the events of several choices (`n` > 1) interleave: each
choice's text is scanned on its own; scanning never changes the bytes relayed.
"""

from __future__ import annotations

import re
from operator import attrgetter
from typing import Any, Final

import orjson

from gateway.audit.sse import raws
from gateway.inputs.paths import CHAT, COMPLETIONS
from gateway.verify.markers import MarkerKey, MarkerScanner

MAX_TEXT: Final = 1 << 20  # answer text kept for the history; longer answers are not recorded
_STRING = rb'"((?:[^"\\]|\\.)*)"'
_FIELD: Final = {
    CHAT: re.compile(rb'"content":' + _STRING),
    COMPLETIONS: re.compile(rb'"text":' + _STRING),
}
_ANY = re.compile(rb'"(?:content|text|delta|output_text)":' + _STRING)
_STARTED = attrgetter("started")
_INDEX = re.compile(rb'"index":(\d{1,6})')  # a choice's index (escaped inside text, so no match)


class AnswerScan:
    def __init__(self, markers: MarkerKey | None, path: str) -> None:
        self._key = markers
        self._scanners: dict[int, MarkerScanner] = {}  # per choice index
        self._field = _FIELD.get(path, _ANY)
        self._keep = path in _FIELD
        self._parts: list[str] = []
        self._size = 0
        self.text_bytes = 0  # UTF-8 bytes of the text of every choice, kept or not
        self.markers = 0  # live markers found, in every choice's text
        # Some choice's text so far ends with the start of what may be a marker.
        self.marker_started = False

    @property
    def text(self) -> str | None:
        """The answer's text, when it was short enough to keep."""
        return "".join(self._parts) if self._keep else None

    def _scan(self, piece: str, index: int = 0) -> None:
        if self._key is None:
            return
        scanner = self._scanners.get(index)
        if scanner is None:
            scanner = self._scanners[index] = MarkerScanner(self._key)
        found = len(scanner.found)
        scanner.feed(piece)
        self.markers += len(scanner.found) - found
        scanners = self._scanners
        self.marker_started = scanner.started or (
            len(scanners) > 1 and any(map(_STARTED, scanners.values()))
        )

    def _take(self, piece: str, index: int) -> None:
        self._scan(piece, index)
        if index != 0:
            self._keep, self._parts = False, []  # the history keeps one-choice answers only
        if self._keep:
            self._size += len(piece)
            if self._size > MAX_TEXT:
                self._keep, self._parts = False, []
            else:
                self._parts.append(piece)

    def events(self, data: bytes) -> None:
        """Complete stream events, in order, before they are relayed."""
        for event in raws(data) if b'"index":' in data else (data,):
            self.event(event)

    def event(self, event: bytes) -> None:
        """One complete stream event, before it is relayed."""
        found = _INDEX.search(event) if b'"index":' in event else None
        index = int(found.group(1)) if found else 0
        for raw in self._field.findall(event):
            piece = self._decode(raw)
            if piece is not None:
                self._take(piece, index)

    def _decode(self, raw: bytes) -> str | None:
        """One text field's string, counted in `text_bytes`; None when it is not valid JSON."""
        try:
            piece: str = orjson.loads(b'"' + raw + b'"')
        except orjson.JSONDecodeError:
            self._keep = False  # not text we can reproduce: record nothing of it
            self.text_bytes += len(raw)
            return None
        self.text_bytes += len(piece) if piece.isascii() else len(piece.encode(errors="replace"))
        return piece

    def body(self, data: bytes, parsed: Any) -> None:
        """A plain answer: markers anywhere in it, the text of its one choice, the size of the
        text of all (its text fields, as a stream's are read)."""
        self._scan(data.decode("utf-8", "replace"))
        keep = self._keep
        for raw in self._field.findall(data):
            self._decode(raw)
        self._keep = keep
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
