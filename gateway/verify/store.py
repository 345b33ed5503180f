"""The detective's history in a memory-mapped file every worker of one gateway shares: `capacity`
slots in regions of `tenant_cap`, each slot a prefix key, the namespace that recorded it, its
tenant, when, and the recording request's nonce. Keys are keyed digests, never prompt text.

Invariant: every read and write happens under an exclusive `flock` of the file; each tenant has
a home region and no tenant holds more than `tenant_cap` records; a tenant's records are never
handed to another tenant: while a free region is left each new tenant gets its own (so its
traffic evicts only its own oldest records), and after that a new tenant shares the home of the
largest tenant, whose oldest records in a full bucket go first (the largest tenant present in
the bucket loses its oldest). A tenant starts over only when more than `capacity / 8` tenants
hold records (the directory is full), and then the one with the fewest records goes.
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

MAGIC: Final = b"KVFHIST3"
OLD_MAGICS: Final = (b"KVFHIST1", b"KVFHIST2")  # earlier layouts: nothing to keep
_HEAD: Final = struct.Struct("<8sIId")  # magic, slots per region, regions, created
# tenant tag, claimed, newest evicted, last used, entries, home region
_DIR: Final = struct.Struct("<QdddII")
HEADER_BYTES: Final = 4096
BUCKET: Final = 8  # slots probed per key
SLOT_BYTES: Final = 28  # key u64, namespace u64, seen u32, nonce u32, owner u32 (row + 1)


class FingerprintStore:
    """Open it in each process (after fork); `close` when done. Methods are async to share
    the `History` protocol with the Redis twin; they never wait on anything but the flock."""

    def __init__(self, path: Path, capacity: int, tenant_cap: int) -> None:
        cap = max(BUCKET, tenant_cap - tenant_cap % BUCKET)
        regions = max(1, capacity // cap)
        n = regions * cap
        rows = n // BUCKET
        dir_bytes = -(-rows * _DIR.size // 4096) * 4096
        size = HEADER_BYTES + dir_bytes + n * SLOT_BYTES
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        with self._locked():
            if os.pread(self._fd, len(MAGIC), 0) in OLD_MAGICS:
                os.ftruncate(self._fd, 0)
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
        self.cap, self.regions, self.rows = cap, regions, rows
        self._map = mmap.mmap(self._fd, size)
        head = memoryview(self._map)[HEADER_BYTES : HEADER_BYTES + rows * _DIR.size]
        self._dir_words = head.cast("Q")  # 5 words a row: tag first, entries | home << 32 last
        self._dir_floats = head.cast("d")  # the same rows: claimed, evicted, last used at 1-3
        body = memoryview(self._map)[HEADER_BYTES + dir_bytes :]
        self._keys = body[: n * 8].cast("Q")
        self._ns = body[n * 8 : n * 16].cast("Q")
        self._seen = body[n * 16 : n * 20].cast("I")
        self._nonce = body[n * 20 : n * 24].cast("I")
        self._owner = body[n * 24 : n * 28].cast("I")
        self._views = (
            self._dir_words, self._dir_floats, head, self._keys, self._ns, self._seen,
            self._nonce, self._owner, body,
        )  # fmt: skip
        self._row_of: dict[int, int] = {}

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _dir(self, r: int) -> tuple[int, float, float, float, int, int]:
        tag, claimed, evicted, used, entries, home = _DIR.unpack_from(
            self._map, HEADER_BYTES + r * _DIR.size
        )
        return int(tag), float(claimed), float(evicted), float(used), int(entries), int(home)

    def _set_dir(self, r: int, *fields: float | int) -> None:
        _DIR.pack_into(self._map, HEADER_BYTES + r * _DIR.size, *fields)

    def _entries(self, r: int) -> int:
        return int(self._dir_words[r * 5 + 4]) & 0xFFFFFFFF

    def _row(self, tenant: int, now: float, claim: bool) -> int | None:
        """The tenant's directory row; with `claim`, one is made for it."""
        r = self._row_of.get(tenant)
        if r is not None and self._dir_words[r * 5] == tenant:
            return r
        tags = self._dir_words[0::5].tolist()
        found = tags.index(tenant) if tenant in tags else None
        if found is None and claim:
            found = self._claim(tags, now)
            self._set_dir(found, tenant, now, 0.0, now, 0, self._home(tags))
        if found is not None:
            self._row_of[tenant] = found
        return found

    def _claim(self, tags: list[int], now: float) -> int:
        """A free row; with none left, the row of the tenant with the fewest records (least
        recently used among them), whose records are cleared."""
        if 0 in tags:
            return tags.index(0)
        r = min(range(self.rows), key=lambda i: (self._entries(i), self._dir(i)[3]))
        if self._entries(r):
            mine = r + 1
            for slot, owner in enumerate(self._owner.tolist()):
                if owner == mine:
                    self._keys[slot] = self._ns[slot] = self._owner[slot] = 0
        tags[r] = 0
        return r

    def _home(self, tags: list[int]) -> int:
        """A region no tenant calls home; with none left, the largest tenant's home."""
        last = self._dir_words[4::5].tolist()  # entries | home << 32, per row
        live = [word for tag, word in zip(tags, last, strict=True) if tag]
        taken = {word >> 32 for word in live}
        free = next((g for g in range(self.regions) if g not in taken), None)
        if free is not None:
            return free
        return int(max(live, key=lambda word: word & 0xFFFFFFFF) >> 32)

    def _bucket(self, region: int, key: int) -> range:
        base = region * self.cap + key % self.cap // BUCKET * BUCKET
        return range(base, base + BUCKET)

    async def record(self, who: Recorder, keys: Sequence[int], nonce: int) -> list[bool]:
        return self.record_now(who, keys, nonce, time.time())

    def record_now(self, who: Recorder, keys: Sequence[int], nonce: int, now: float) -> list[bool]:
        stamp, ns = int(now), who.namespace
        words, owners, slot_keys, slot_ns = self._dir_words, self._owner, self._keys, self._ns
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # inline, not `_locked`: twice in every request
        try:
            row = self._row(who.tenant, now, claim=True)
            assert row is not None
            at, mine = row * 5 + 4, row + 1
            home = words[at] >> 32
            before = []
            for key in keys:
                bucket = self._bucket(home, key)
                free = -1
                for slot in bucket:
                    owner = owners[slot]
                    if owner == mine and slot_keys[slot] == key and slot_ns[slot] == ns:
                        self._seen[slot], self._nonce[slot] = stamp, nonce
                        before.append(True)
                        break
                    if owner == 0 and free < 0:
                        free = slot
                else:
                    before.append(False)
                    if free >= 0:  # the common case: a free slot, no other row's books change
                        slot_keys[free], slot_ns[free], owners[free] = key, ns, mine
                        self._seen[free], self._nonce[free] = stamp, nonce
                        words[at] += 1  # entries, the low half of the row's last word
                    else:
                        self._evict_into(bucket, row, key, ns, stamp, nonce)
            self._dir_floats[row * 5 + 3] = now  # last used
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        return before

    def _evict_into(
        self, bucket: range, row: int, key: int, ns: int, stamp: int, nonce: int
    ) -> None:
        """Record `key` over the bucket's oldest record (`_older`), charging its row."""
        slot = bucket.start
        for other in bucket[1:]:
            if self._older(other, slot):
                slot = other
        victim, dropped = self._owner[slot] - 1, float(self._seen[slot])
        self._keys[slot], self._ns[slot], self._owner[slot] = key, ns, row + 1
        self._seen[slot], self._nonce[slot] = stamp, nonce
        tag, claimed, evicted, used, entries, region = self._dir(victim)
        self._set_dir(victim, tag, claimed, max(evicted, dropped), used, entries - 1, region)
        self._dir_words[row * 5 + 4] += 1

    def _older(self, slot: int, than: int) -> bool:
        """Whether `slot` goes before `than`: its tenant holds more records, or as many and it
        is older."""
        a, b = self._entries(self._owner[slot] - 1), self._entries(self._owner[than] - 1)
        return a > b or (a == b and self._seen[slot] < self._seen[than])

    async def presence(
        self, who: Recorder, keys: Sequence[int], nonce: int, before: Sequence[bool]
    ) -> list[Presence]:
        with self._locked():
            row = self._row(who.tenant, 0.0, claim=False)
            mine = -1 if row is None else row + 1
            out = []
            for key, was in zip(keys, before, strict=True):
                own, other = was, 0
                for region in range(self.regions):
                    for slot in self._bucket(region, key):
                        if self._keys[slot] != key or not self._owner[slot]:
                            continue
                        ns = int(self._ns[slot])
                        if self._owner[slot] == mine and ns == who.namespace:
                            own = own or self._nonce[slot] != nonce
                        elif not other:
                            other = ns
                out.append(Presence(own, other))
        return out

    async def reach(self) -> list[Reach]:
        with self._locked():
            rows = [self._dir(r) for r, tag in enumerate(self._dir_words[0::5].tolist()) if tag]
        return [
            Reach(tag, entries, self.cap, max(self.created, claimed, evicted), evicted > 0)
            for tag, claimed, evicted, _, entries, _ in rows
        ]

    def close(self) -> None:
        for view in self._views:
            view.release()
        self._map.close()
        os.close(self._fd)
