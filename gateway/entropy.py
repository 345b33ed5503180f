"""Request ids and nonces from the OS's CSPRNG, drawn a pool at a time: one `getrandom` per few
hundred requests instead of three per request (each a syscall that also hands the GIL over).

Invariant: no byte is handed out twice, and each process draws its own pool (a forked worker
starts with none, so two workers never share ids).
"""

from __future__ import annotations

import os
import threading
from typing import Final

_POOL_BYTES: Final = 4096


class _Pool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buf, self._at = b"", 0

    def reset(self) -> None:
        self._lock = threading.Lock()  # a lock held in the parent at fork stays held in a copy
        self._buf, self._at = b"", 0

    def take(self, n: int) -> bytes:
        with self._lock:
            if self._at + n > len(self._buf):
                self._buf, self._at = os.urandom(max(_POOL_BYTES, n)), 0
            out = self._buf[self._at : self._at + n]
            self._at += n
            return out


_pool = _Pool()
os.register_at_fork(after_in_child=_pool.reset)


def token_hex(nbytes: int) -> str:
    """`nbytes` random bytes as hex (as `secrets.token_hex`)."""
    return _pool.take(nbytes).hex()


def nonce32() -> int:
    """A random nonzero 32-bit integer."""
    return int.from_bytes(_pool.take(4), "big") or 1
