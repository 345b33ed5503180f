"""A fixed-size table of fingerprint counts in a memory-mapped file that every gateway worker
shares: the detective audit's history. Keys are 64-bit keyed digests (never prompt text).

Invariant: every read and write of the table happens under an exclusive `flock` of the file,
so counts are never lost between processes; a full bucket evicts its oldest entry and moves
`complete_since` forward, so the history never claims to reach back past an eviction.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

MAGIC: Final = b"KVFHIST1"
_HEAD: Final = struct.Struct("<8sQdd")  # magic, slots, created, newest evicted entry's time
HEADER_BYTES: Final = 4096
BUCKET: Final = 8  # slots probed per key


class FingerprintStore:
    """Counts per fingerprint. Open it in each process (after fork); `close` when done."""

    def __init__(self, path: Path, capacity: int) -> None:
        slots = max(BUCKET, capacity - capacity % BUCKET)
        size = HEADER_BYTES + slots * 16
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        with self._locked_fd():
            if os.fstat(self._fd).st_size == 0:
                os.ftruncate(self._fd, size)
                os.pwrite(self._fd, _HEAD.pack(MAGIC, slots, time.time(), 0.0), 0)
            magic, slots, _, _ = _HEAD.unpack(os.pread(self._fd, _HEAD.size, 0))
            if magic != MAGIC or os.fstat(self._fd).st_size != HEADER_BYTES + slots * 16:
                raise ValueError(f"{path} is not a kvfence history file of this layout")
        self._slots = slots
        self._map = mmap.mmap(self._fd, HEADER_BYTES + slots * 16)
        self._body = memoryview(self._map)[HEADER_BYTES:]
        self._keys = self._body[: slots * 8].cast("Q")
        self._counts = self._body[slots * 8 : slots * 12].cast("I")
        self._seen = self._body[slots * 12 : slots * 16].cast("I")

    @contextmanager
    def _locked_fd(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _head(self) -> tuple[float, float]:
        _, _, created, evicted = _HEAD.unpack_from(self._map, 0)
        return float(created), float(evicted)

    @property
    def complete_since(self) -> float:
        """The history holds every fingerprint recorded since this time."""
        return max(self._head())

    def add(self, keys: Iterable[int], now: float | None = None) -> None:
        """Count one more occurrence of each key (a key is a nonzero 64-bit integer)."""
        stamp = int(now if now is not None else time.time())
        # flock inline, not through `_locked_fd`: this runs twice per proxied request.
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            for key in keys:
                self._add(key, stamp)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _add(self, key: int, stamp: int) -> None:
        base = key % self._slots // BUCKET * BUCKET
        oldest = base
        for slot in range(base, base + BUCKET):
            held = self._keys[slot]
            if held == key or held == 0:
                self._keys[slot] = key
                self._counts[slot] = min(self._counts[slot] + 1 if held else 1, 0xFFFFFFFF)
                self._seen[slot] = stamp
                return
            if self._seen[slot] < self._seen[oldest]:
                oldest = slot
        evicted = self._head()[1]
        struct.pack_into("<d", self._map, 24, max(evicted, float(self._seen[oldest])))
        self._keys[oldest], self._counts[oldest], self._seen[oldest] = key, 1, stamp

    def counts(self, keys: Iterable[int]) -> list[int]:
        """How often each key was added (0: never, or evicted)."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            return [self._count(key) for key in keys]
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _count(self, key: int) -> int:
        base = key % self._slots // BUCKET * BUCKET
        for slot in range(base, base + BUCKET):
            if self._keys[slot] == key:
                return int(self._counts[slot])
        return 0

    def close(self) -> None:
        for view in (self._keys, self._counts, self._seen, self._body):
            view.release()
        self._map.close()
        os.close(self._fd)
