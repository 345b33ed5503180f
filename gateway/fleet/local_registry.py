"""The tenant registry as one JSON file (`registry.path`, by default `state_dir/registry.json`)
that every worker of one gateway reads, and that `kvfence tenants` / `kvfence keys` change
offline or through the admin listener; the Redis twin is `gateway.fleet.registry`.

Invariant: a change is read-modify-write under an exclusive `flock` of the lock file beside it,
written to a temporary file, flushed and renamed over the old one, so a reader sees the old
document or the new one, never a mix, and no two changes overwrite each other; every change
raises the version by one. The file holds digests, never keys (mode 0600).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from gateway.policy.registry import Document, RegistryError, decode, empty_document, encode

T = TypeVar("T")
Stamp = tuple[int, int, int]


class FileRegistry:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = path.with_name(path.name + ".lock")
        self._stamp: Stamp | None = None

    def stamp(self) -> Stamp | None:
        """What tells a change apart cheaply: inode, mtime and size (None: no file yet)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def read(self) -> Document:
        """The document (an empty one before the first change). Blocking."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return empty_document()
        except OSError as exc:
            raise RegistryError(f"cannot read the registry {self.path}: {exc.strerror}") from None
        return decode(raw, str(self.path))

    def changed(self) -> Document | None:
        """The document when it changed since the last call (the first call: always). Blocking."""
        stamp = self.stamp()
        if stamp == self._stamp and stamp is not None:
            return None
        doc = self.read()
        self._stamp = stamp
        return doc

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self._lock, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise RegistryError(f"cannot lock the registry {self.path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def update(self, change: Callable[[Document], T]) -> T:
        """Apply `change` to the current document and store the result (one version up).
        Blocking; RegistryError (from `change` or the file) leaves the file as it was."""
        with self._locked():
            doc = self.read()
            result = change(doc)
            doc["version"] += 1
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as out:
                    out.write(encode(doc))
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, self.path)
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                raise RegistryError(
                    f"cannot write the registry {self.path}: {exc.strerror}"
                ) from None
            return result


class LocalRegistryStore:
    """The file registry for an event loop: every file operation runs in a thread."""

    kind = "file"

    def __init__(self, path: Path) -> None:
        self.file = FileRegistry(path)

    async def changed(self) -> Document | None:
        return await asyncio.to_thread(self.file.changed)

    async def update(self, change: Callable[[Document], T]) -> T:
        return await asyncio.to_thread(self.file.update, change)

    async def close(self) -> None:
        return None


def fresh(path: Path) -> Document:
    """The document at `path` (empty when absent): for the CLI. Blocking."""
    return FileRegistry(path).read() if path.exists() else empty_document()
