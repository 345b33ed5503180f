"""Values the gateway replicas share in Redis, sealed: each carries an HMAC-SHA256 tag under a key
derived from the gateway's secret, bound to the value's key name, its field (the backend or
tenant it is about) and the time it was written. Whoever can reach Redis cannot forge a value,
move one to another key or field, or date one in the future; replaying an older value of the
same field is caught by the reader, which keeps the newest time it has seen per field.

Invariant: `open` returns a value only when its tag verifies (`hmac.compare_digest`), and its
name and field are the ones asked for, and its time is neither beyond `skew_s` in the future nor
older than `max_age_s` (when given); anything else is None, which a caller reads as "unknown":
never as a default that lifts a quarantine, marks a backend verified or widens a limit.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import time
from dataclasses import dataclass
from typing import Final

MAGIC: Final = b"S1"
_TAG = 32
_TIME = struct.Struct(">Q")  # milliseconds since the epoch
_HEAD = len(MAGIC) + _TAG + _TIME.size


@dataclass(frozen=True, slots=True)
class Opened:
    value: bytes
    written: float  # seconds since the epoch, by the writer's clock


class Sealer:
    def __init__(self, secret: bytes, *, skew_s: float = 30.0) -> None:
        self._key = hmac.new(secret, b"kvfence shared values v1", hashlib.sha256).digest()
        self.skew_s = skew_s

    def seal(self, name: str, field: str, value: bytes, *, now: float | None = None) -> bytes:
        stamp = _TIME.pack(int((time.time() if now is None else now) * 1000))
        return MAGIC + self._tag(name, field, stamp, value) + stamp + value

    def open(
        self,
        name: str,
        field: str,
        raw: bytes | None,
        *,
        max_age_s: float | None = None,
        now: float | None = None,
    ) -> Opened | None:
        if raw is None or len(raw) < _HEAD or not raw.startswith(MAGIC):
            return None
        tag, stamp, value = raw[2 : 2 + _TAG], raw[2 + _TAG : _HEAD], raw[_HEAD:]
        if not hmac.compare_digest(tag, self._tag(name, field, stamp, value)):
            return None
        written = _TIME.unpack(stamp)[0] / 1000
        now = time.time() if now is None else now
        if written > now + self.skew_s:
            return None
        if max_age_s is not None and written < now - max_age_s:
            return None
        return Opened(value, written)

    def _tag(self, name: str, field: str, stamp: bytes, value: bytes) -> bytes:
        mac = hmac.new(self._key, digestmod=hashlib.sha256)
        for part in (name.encode(), field.encode(), stamp, value):
            mac.update(struct.pack(">I", len(part)))  # length-prefixed: no two splits alike
            mac.update(part)
        return mac.digest()
