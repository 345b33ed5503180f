"""Per-tenant limits that every worker of one gateway shares: each tenant's allowance
(`bucket`: requests per second, in flight, tokens per minute charged from each answer) in a
memory-mapped table in the state directory, changed under `flock`.

Invariant: an admission is a read-modify-write under the lock, so N workers give a tenant the
allowance one would, never N times it; a refusal says how long to wait (`retry_after_s`).
"""

from __future__ import annotations

import fcntl
import math
import mmap
import os
import struct
import time
import zlib
from pathlib import Path
from typing import Final

from aiohttp import web

from gateway.fleet import bucket
from gateway.fleet.bucket import Allowance, Refusal
from gateway.policy.tenant_model import TenantLimits

_SLOT: Final = struct.Struct(
    "<64sdddqd"
)  # tenant, rps tokens, rps time, tpm tokens, in flight, tpm time
_HEAD: Final = struct.Struct("<8sqd")  # magic, slots, generation (the gateway start that made it)
MAGIC: Final = b"KVFLIM01"
SLOTS: Final = 4096

__all__ = ["LIMITS", "Refusal", "SharedLimits"]


class SharedLimits:
    """Open in each worker (after fork). `generation` identifies one gateway start: a table left
    by an earlier start is reset, so no request of a dead process holds a slot forever."""

    def __init__(self, path: Path, generation: float) -> None:
        size = _HEAD.size + SLOTS * _SLOT.size
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            head = os.pread(self._fd, _HEAD.size, 0)
            if len(head) < _HEAD.size or _HEAD.unpack(head) != (MAGIC, SLOTS, generation):
                os.ftruncate(self._fd, 0)
                os.ftruncate(self._fd, size)
                os.pwrite(self._fd, _HEAD.pack(MAGIC, SLOTS, generation), 0)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._map = mmap.mmap(self._fd, size)
        self._index: dict[str, int] = {}

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)

    def _slot(self, tenant: str) -> int:
        """The tenant's slot (found or claimed; called under the lock)."""
        found = self._index.get(tenant)
        if found is not None:
            return found
        name = tenant.encode()[:64].ljust(64, b"\0")
        start = zlib.crc32(name) % SLOTS  # the same in every process (unlike hash())
        for probe in range(SLOTS):
            slot = (start + probe) % SLOTS
            held = self._map[self._at(slot) : self._at(slot) + 64]
            if held == name or held == b"\0" * 64:
                if held != name:
                    now = time.time()
                    self._write(slot, name, math.inf, now, math.inf, 0, now)
                self._index[tenant] = slot
                return slot
        raise RuntimeError("the limits table is full")  # 4096 tenants with limits

    @staticmethod
    def _at(slot: int) -> int:
        return _HEAD.size + slot * _SLOT.size

    def _read(self, slot: int) -> tuple[bytes, float, float, float, int, float]:
        name, rps, rps_t, tpm, flight, tpm_t = _SLOT.unpack_from(self._map, self._at(slot))
        return name, rps, rps_t, tpm, flight, tpm_t

    def _write(
        self,
        slot: int,
        name: bytes,
        rps: float,
        rps_t: float,
        tpm: float,
        flight: int,
        tpm_t: float,
    ) -> None:
        _SLOT.pack_into(self._map, self._at(slot), name, rps, rps_t, tpm, flight, tpm_t)

    def admit(self, tenant: str, limits: TenantLimits, now: float | None = None) -> Refusal | None:
        """Take one request's allowance, or say why not and for how long."""
        now = time.time() if now is None else now
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            slot = self._slot(tenant)
            name, rps, rps_t, tpm, flight, tpm_t = self._read(slot)
            state, refusal = bucket.admit(Allowance(rps, rps_t, tpm, tpm_t, flight), limits, now)
            self._store(slot, name, state)
            return refusal
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def hold(self, tenant: str, limits: TenantLimits, tokens: int) -> Refusal | None:
        """Hold a reservation of the tokens-per-minute bucket (`bucket.hold`)."""
        now = time.time()
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            slot = self._slot(tenant)
            name, rps, rps_t, tpm, flight, tpm_t = self._read(slot)
            allowance = Allowance(rps, rps_t, tpm, tpm_t, flight)
            state, refusal = bucket.hold(allowance, limits, tokens, now)
            self._store(slot, name, state)
            return refusal
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def release(self, tenant: str, tokens: int = 0, now: float | None = None) -> None:
        """The request ended: free its concurrency slot and charge the tokens it used."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            slot = self._slot(tenant)
            name, rps, rps_t, tpm, flight, tpm_t = self._read(slot)
            state = bucket.charge(Allowance(rps, rps_t, tpm, tpm_t, flight), tokens)
            self._store(slot, name, state)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _store(self, slot: int, name: bytes, state: Allowance) -> None:
        self._write(slot, name, state.rps, state.rps_at, state.tpm, state.flight, state.tpm_at)


LIMITS = web.AppKey("kvfence_limits", SharedLimits)
