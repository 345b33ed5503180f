"""Stop strings over a stream of text deltas.

Invariant: text is released only once it can no longer change: never the start of what might
still become a stop string (the decoder already never splits a UTF-8 character).
"""

from __future__ import annotations

from typing import Protocol


class Decoder(Protocol):
    def push(self, token_id: int) -> str: ...
    def flush(self) -> str: ...


class TextStream:
    def __init__(self, decoder: Decoder, stop: tuple[str, ...] = ()) -> None:
        self._decoder = decoder
        self._stop = stop
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._pending = ""  # decoded, not yet released (may be the start of a stop string)
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Adds one token; returns the text that is now final (maybe empty)."""
        self._pending += self._decoder.push(token_id)
        return self._release(final=False)

    def finish(self) -> str:
        """Releases whatever is held back at the end of the response."""
        if self.stopped:
            return ""
        self._pending += self._decoder.flush()
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if self.stopped:
            return ""
        found = [at for at in (self._pending.find(stop) for stop in self._stop) if at >= 0]
        if found:  # the earliest stop string wins, whichever is listed first
            self.stopped = True
            out, self._pending = self._pending[: min(found)], ""
            return out
        keep = 0 if final else min(self._hold, len(self._pending))
        cut = len(self._pending) - keep
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out
