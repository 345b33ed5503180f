"""The replay guard of handles: every (key id, request id) is admitted once within its expiry.

Invariant: memory is bounded by the live handles (expired entries are pruned on every insert);
when it is full, admission fails closed (`full`) rather than forgetting.
"""

from __future__ import annotations

import heapq
import threading


class ReplayGuard:
    """Request ids seen within their expiry. Memory is one dict entry and one heap entry per
    live handle; expired entries are pruned on every insert."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._seen: dict[tuple[str, str], float] = {}
        self._heap: list[tuple[float, tuple[str, str]]] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._seen)

    def admit(self, key: tuple[str, str], until: float, now: float) -> str | None:
        """None when `key` is admitted now, else why not: "replayed" or "full"."""
        with self._lock:
            while self._heap and self._heap[0][0] < now:
                _, old = heapq.heappop(self._heap)
                self._seen.pop(old, None)
            if key in self._seen:
                return "replayed"
            if len(self._seen) >= self._capacity:
                return "full"
            self._seen[key] = until
            heapq.heappush(self._heap, (until, key))
            return None
