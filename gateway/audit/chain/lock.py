"""One writer per audit chain: a non-blocking `flock` on `FILE.lock`, released when the holder
dies; the holder's pid is written into the lock file so a refusal can name it."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from gateway.audit.chain.format import lock_path


class AuditWriteError(Exception):
    """The audit record could not be written; the response must fail closed."""


class AuditLocked(AuditWriteError):
    """Another process holds this chain."""


def take_lock(path: Path) -> int:
    """The lock on the chain at `path` (its file descriptor), or `AuditLocked`."""
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise AuditLocked(
            f"audit log {path} is held by another process (pid {holder}); one process writes "
            "each chain: stop that gateway first"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def check_free(path: Path) -> None:
    """Raise `AuditLocked` when another process holds the chain at `path` (a start-up check:
    the writer takes the lock for good when it opens the log)."""
    if path.parent.is_dir():
        os.close(take_lock(path))
