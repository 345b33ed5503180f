"""The detective's history in a memory-mapped file every worker of one gateway shares: per
tenant a region of `tenant_cap` slots, each slot a prefix key, the namespace that recorded it,
when, and the recording request's nonce. Keys are keyed digests, never prompt text.

Invariant: every read and write happens under an exclusive `flock` of the file; a tenant's
records live in its own region, so no tenant's traffic can evict another tenant's records (a
full bucket evicts the region's own oldest entry, and that moves only this tenant's
`complete_since`); a region is handed to another tenant only when every region is taken, and
the tenant that loses it starts over as a tenant with a young history.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from gateway.verify.history import Presence, Reach, Recorder

MAGIC: Final = b"KVFHIST2"
OLD_MAGIC: Final = b"KVFHIST1"  # namespace-keyed digests, one global completeness time
_HEAD: Final = struct.Struct("<8sIId")  # magic, slots per region, regions, created
_DIR: Final = struct.Struct("<QdddI4x")  # tenant tag, claimed, newest evicted, last used, entries
HEADER_BYTES: Final = 4096
BUCKET: Final = 8  # slots probed per key
SLOT_BYTES: Final = 24  # key u64, namespace u64, seen u32, nonce u32


class FingerprintStore:
    """Open it in each process (after fork); `close` when done. Methods are async to share
    the `History` protocol with the Redis twin; they never wait on anything but the flock."""

    def __init__(self, path: Path, capacity: int, tenant_cap: int) -> None:
        cap = max(BUCKET, tenant_cap - tenant_cap % BUCKET)
        regions = max(1, capacity // cap)
        dir_bytes = -(-regions * _DIR.size // 4096) * 4096
        size = HEADER_BYTES + dir_bytes + regions * cap * SLOT_BYTES
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        with self._locked():
            if os.pread(self._fd, len(OLD_MAGIC), 0) == OLD_MAGIC:
                os.ftruncate(self._fd, 0)  # keys of an earlier release: nothing to keep
            if os.fstat(self._fd).st_size == 0:
                os.ftruncate(self._fd, size)
                os.pwrite(self._fd, _HEAD.pack(MAGIC, cap, regions, time.time()), 0)
            magic, got_cap, got_regions, created = _HEAD.unpack(os.pread(self._fd, _HEAD.size, 0))
            if (magic, got_cap, got_regions) != (MAGIC, cap, regions) or (
                os.fstat(self._fd).st_size != size
            ):
                raise ValueError(
                    f"{path} is not a kvfence history of this layout (capacity and tenant_cap "
                    "changed?): move it away and restart"
                )
        self.created = float(created)
        self.cap, self.regions = cap, regions
        self._map = mmap.mmap(self._fd, size)
        body = memoryview(self._map)[HEADER_BYTES + dir_bytes :]
        n = regions * cap
        self._keys = body[: n * 8].cast("Q")
        self._ns = body[n * 8 : n * 16].cast("Q")
        self._seen = body[n * 16 : n * 20].cast("I")
        self._nonce = body[n * 20 : n * 24].cast("I")
        self._views = (self._keys, self._ns, self._seen, self._nonce, body)
        self._slots_at = HEADER_BYTES + dir_bytes
        self._region_of: dict[int, int] = {}

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _dir(self, r: int) -> tuple[int, float, float, float, int]:
        tag, claimed, evicted, used, entries = _DIR.unpack_from(
            self._map, HEADER_BYTES + r * _DIR.size
        )
        return int(tag), float(claimed), float(evicted), float(used), int(entries)

    def _set_dir(self, r: int, *fields: float | int) -> None:
        _DIR.pack_into(self._map, HEADER_BYTES + r * _DIR.size, *fields)

    def _region(self, tenant: int, now: float, claim: bool) -> int | None:
        """The tenant's region; with `claim`, one is taken for it (free, else least used)."""
        r = self._region_of.get(tenant)
        if r is not None and self._dir(r)[0] == tenant:
            return r
        found = next((i for i in range(self.regions) if self._dir(i)[0] == tenant), None)
        if found is None and claim:
            found = min(range(self.regions), key=lambda i: (self._dir(i)[0] != 0, self._dir(i)[3]))
            self._clear(found)
            self._set_dir(found, tenant, now, 0.0, now, 0)
        if found is not None:
            self._region_of[tenant] = found
        return found

    def _clear(self, r: int) -> None:
        """Zero region r's slots in each of the four arrays (a new tenant starts empty)."""
        n, at = self.regions * self.cap, self._slots_at
        for width, offset in ((8, 0), (8, 8 * n), (4, 16 * n), (4, 20 * n)):
            lo = at + offset + r * self.cap * width
            self._map[lo : lo + self.cap * width] = bytes(self.cap * width)

    def _bucket(self, r: int, key: int) -> range:
        base = r * self.cap + key % self.cap // BUCKET * BUCKET
        return range(base, base + BUCKET)

    async def record(self, who: Recorder, keys: Sequence[int], nonce: int) -> list[bool]:
        return self.record_now(who, keys, nonce, time.time())

    def record_now(self, who: Recorder, keys: Sequence[int], nonce: int, now: float) -> list[bool]:
        stamp = int(now)
        with self._locked():
            r = self._region(who.tenant, now, claim=True)
            assert r is not None
            tag, claimed, evicted, _, entries = self._dir(r)
            before = []
            for key in keys:
                was, grew, dropped = self._put(r, key, who.namespace, stamp, nonce)
                before.append(was)
                entries += grew
                evicted = max(evicted, dropped)
            self._set_dir(r, tag, claimed, evicted, now, entries)
        return before

    def _put(self, r: int, key: int, ns: int, stamp: int, nonce: int) -> tuple[bool, int, float]:
        """(recorded before, slots newly used, seen time of an entry evicted for it)."""
        bucket = self._bucket(r, key)
        free = oldest = None
        for slot in bucket:
            held = self._keys[slot]
            if held == key and self._ns[slot] == ns:
                self._seen[slot], self._nonce[slot] = stamp, nonce
                return True, 0, 0.0
            if held == 0:
                free = slot if free is None else free
            elif oldest is None or self._seen[slot] < self._seen[oldest]:
                oldest = slot
        if free is not None:
            slot, grew, dropped = free, 1, 0.0
        else:
            assert oldest is not None
            slot, grew, dropped = oldest, 0, float(self._seen[oldest])
        self._keys[slot], self._ns[slot] = key, ns
        self._seen[slot], self._nonce[slot] = stamp, nonce
        return False, grew, dropped

    async def presence(
        self, who: Recorder, keys: Sequence[int], nonce: int, before: Sequence[bool]
    ) -> list[Presence]:
        with self._locked():
            own_region = self._region(who.tenant, 0.0, claim=False)
            claimed = [r for r in range(self.regions) if self._dir(r)[0] != 0]
            out = []
            for key, was in zip(keys, before, strict=True):
                own, other = was, 0
                for r in claimed:
                    for slot in self._bucket(r, key):
                        if self._keys[slot] != key:
                            continue
                        ns = int(self._ns[slot])
                        if r == own_region and ns == who.namespace:
                            own = own or self._nonce[slot] != nonce
                        elif not other:
                            other = ns
                out.append(Presence(own, other))
        return out

    async def reach(self) -> list[Reach]:
        with self._locked():
            rows = [self._dir(r) for r in range(self.regions)]
        return [
            Reach(tag, entries, self.cap, max(self.created, claimed, evicted), evicted > 0)
            for tag, claimed, evicted, _, entries in rows
            if tag
        ]

    def close(self) -> None:
        for view in self._views:
            view.release()
        self._map.close()
        os.close(self._fd)
