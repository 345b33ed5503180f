"""Canary content markers: short strings a canary prompt carries, recognisable by any gateway
process holding the key (a MAC, no shared list), live for a bounded time.

Invariant: only the holder of the marker key can mint a marker that `is_live` accepts, so no
tenant can make another tenant's answer (or its own) look like a canary leak.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from typing import Final

PREFIX: Final = "kvfc"
_BODY = re.compile(r"kvfc([0-9a-f]{8})([0-9a-f]{12})")
_STARTED = re.compile(r"kvfc[0-9a-f]{0,19}$")  # text that may still become a marker
MARKER_LEN: Final = 4 + 8 + 12
LIVE_S: Final = 24 * 3600.0


class MarkerKey:
    """Mints and recognises markers under one secret (derived from the gateway's namespace key,
    so every worker and replica with the same policy agrees)."""

    __slots__ = ("_key",)

    def __init__(self, secret: bytes) -> None:
        self._key = hmac.new(secret, b"kvfence canary marker v1", hashlib.sha256).digest()

    def _tag(self, stamp: str) -> str:
        return hmac.new(self._key, stamp.encode(), hashlib.sha256).hexdigest()[:12]

    def mint(self, now: float | None = None) -> str:
        """A marker stamped with the minting time (seconds, 32 bits), so any holder of the key
        can tell that it is live without a shared list."""
        stamp = f"{int(now if now is not None else time.time()) & 0xFFFFFFFF:08x}"
        return PREFIX + stamp + self._tag(stamp)

    def is_live(self, stamp: str, tag: str, now: float | None = None) -> bool:
        if not hmac.compare_digest(self._tag(stamp), tag):
            return False
        age = (int(now if now is not None else time.time()) - int(stamp, 16)) & 0xFFFFFFFF
        return age <= LIVE_S

    def find(self, text: str, now: float | None = None) -> list[str]:
        """Every live marker in `text`."""
        if PREFIX not in text:
            return []
        found = _BODY.finditer(text)
        return [m.group(0) for m in found if self.is_live(m.group(1), m.group(2), now)]


class MarkerScanner:
    """Scans a text stream piece by piece; a marker split across pieces is still found."""

    __slots__ = ("_key", "_tail", "found", "started")

    def __init__(self, key: MarkerKey) -> None:
        self._key = key
        self._tail = ""
        self.found: list[str] = []
        # The text so far ends with what may still become a marker: hold it back.
        self.started = False

    def feed(self, piece: str) -> bool:
        """Add text; True when a live marker has been found so far."""
        if not piece:
            return bool(self.found)
        window = self._tail + piece  # holds any marker that started in an earlier piece
        if PREFIX in window:  # nearly no piece has one: skip the search, once per token
            self.found += [m for m in self._key.find(window) if m not in self.found]
        self._tail = tail = window[-(MARKER_LEN - 1) :]
        self.started = PREFIX in tail and _STARTED.search(tail) is not None
        return bool(self.found)
