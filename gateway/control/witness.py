"""The newest registry version this gateway has seen, kept in its state directory (sealed under a
key derived from the API key pepper) so that a restarted worker still knows it: the memory a
restore of the database from an older backup is measured against.

Invariant: the file only moves forward (a version below the one held is never written), is
replaced atomically (written, synced, renamed), and a file that does not open is refused loudly,
never read as "nothing seen".
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import logging
import os
from pathlib import Path

import orjson

from gateway.control.store import Version

log = logging.getLogger("kvfence.gateway.control")


class Witness:
    def __init__(self, path: Path, pepper: bytes) -> None:
        self.path = path
        self._key = hmac.new(pepper, b"kvfence control witness v1", hashlib.sha256).digest()

    def _tag(self, number: int, sha256: str, document: bytes) -> str:
        msg = orjson.dumps([number, sha256]) + b"\n" + document
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest()

    def load(self) -> Version | None:
        """The version held (None: never any). Blocking."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            held = orjson.loads(raw)
            version = Version(int(held["version"]), str(held["sha256"]),
                              str(held["document"]).encode())  # fmt: skip
            tag = str(held["tag"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            log.error("control witness unreadable; ignored", extra={"path": str(self.path)})
            return None
        good = self._tag(version.number, version.sha256, version.document)
        if not hmac.compare_digest(tag, good) or not _digest_ok(version):
            log.error("control witness does not open; ignored", extra={"path": str(self.path)})
            return None
        return version

    def save(self, version: Version) -> None:
        """Hold `version` if it is newer than the one held. Blocking."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # workers of one gateway share the file
            self._save(version)
        finally:
            os.close(fd)

    def _save(self, version: Version) -> None:
        held = self.load()
        if held is not None and held.number >= version.number:
            return
        body = orjson.dumps({
            "version": version.number, "sha256": version.sha256,
            "document": version.document.decode(),
            "tag": self._tag(version.number, version.sha256, version.document),
        })  # fmt: skip
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)


def _digest_ok(version: Version) -> bool:
    return hmac.compare_digest(hashlib.sha256(version.document).hexdigest(), version.sha256)


def digest_ok(version: Version) -> bool:
    """The document hashes to the digest the version names."""
    return _digest_ok(version)
