"""Progress on stderr: a bar redrawn in place on a terminal, otherwise a plain line every few
rounds (CI logs).

Invariant: writes only phase names and counts, never anything from a request or an answer.
"""

from __future__ import annotations

import sys
from typing import TextIO

from kvfence.probe.rounds import Phase

WIDTH = 30


class ProgressBar:
    def __init__(self, stream: TextIO | None = None, every: int = 10) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.every = every
        self._open = False

    def __call__(self, phase: Phase, done: int, total: int) -> None:
        if self.tty:
            filled = WIDTH * done // max(total, 1)
            bar = "#" * filled + "-" * (WIDTH - filled)
            self.stream.write(f"\r{phase:<8} [{bar}] {done}/{total} rounds")
            self._open = done < total
            if not self._open:
                self.stream.write("\n")
        elif done == total or done % self.every == 0:
            self.stream.write(f"probe: {phase} {done}/{total} rounds\n")
        self.stream.flush()

    def close(self) -> None:
        """Ends a bar left open by a phase that stopped early."""
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False
