"""Where receipts are kept: one file per receipt, `PATH/<expiry hour>/<id>.json`, written off the
event loop by the audit log's writer thread, right after the record the receipt names; any
worker of the gateway reads any receipt. The id names its expiry hour, so an expired receipt is
never read and expiry deletes whole folders.

Invariant: `write` returns once the receipt's file is written; a receipt is served only to the
tenant it was issued to, and only until it expires.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

HOUR: Final = 3600
_ID_RE: Final = re.compile(r"^rcpt_([0-9a-f]{1,10})_[0-9a-f]{32}$")


class ReceiptWriteError(Exception):
    """A receipt could not be written: the answer fails closed."""


def new_id(keep_s: float, now: float | None = None) -> str:
    """A fresh receipt id, naming the hour after which it is deleted."""
    expiry = int(((time.time() if now is None else now) + keep_s) // HOUR) + 1
    return f"rcpt_{expiry:x}_{secrets.token_hex(16)}"


def expiry_of(receipt_id: str) -> int | None:
    """The expiry hour of a well-formed id (as hours since the epoch), else None."""
    match = _ID_RE.fullmatch(receipt_id)
    return int(match.group(1), 16) if match else None


@dataclass(frozen=True, slots=True)
class Stored:
    tenant: str
    receipt: dict[str, Any]
    record: bytes  # the answer's audit log line (its leaf in the witnessed log)


class ReceiptStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._folders: set[int] = set()

    def _file(self, receipt_id: str, hour: int) -> Path:
        return self.path / str(hour) / f"{receipt_id}.json"

    def write(self, receipt_id: str, tenant: str, receipt: dict[str, Any], record: bytes) -> None:
        """Blocking (the audit writer thread calls it). Raises ReceiptWriteError."""
        hour = expiry_of(receipt_id)
        assert hour is not None, "ids come from new_id"
        data = orjson.dumps(
            {"tenant": tenant, "record": base64.b64encode(record).decode(), "receipt": receipt}
        )
        path = self._file(receipt_id, hour)
        try:
            try:
                self._write(hour, path, data)
            except FileNotFoundError:  # its folder was removed under us: once more
                self._folders.discard(hour)
                self._write(hour, path, data)
        except OSError as exc:
            raise ReceiptWriteError(f"receipt {path.name}: {exc}") from None

    def get(self, receipt_id: str, now: float | None = None) -> Stored | None:
        """Blocking (call it off the event loop). None: unknown, malformed or expired."""
        hour = expiry_of(receipt_id)
        if hour is None or hour * HOUR <= (time.time() if now is None else now):
            return None
        try:
            doc = orjson.loads(self._file(receipt_id, hour).read_bytes())
            return Stored(str(doc["tenant"]), doc["receipt"], base64.b64decode(doc["record"]))
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None  # absent, or still being written

    def sweep(self, now: float | None = None) -> int:
        """Blocking: delete the folders of expired hours; returns how many."""
        current = (time.time() if now is None else now) // HOUR
        removed = 0
        for folder in self.path.iterdir() if self.path.is_dir() else []:
            if folder.name.isdigit() and int(folder.name) <= current:
                shutil.rmtree(folder, ignore_errors=True)
                self._folders.discard(int(folder.name))
                removed += 1
        return removed

    def _write(self, hour: int, path: Path, data: bytes) -> None:
        if hour not in self._folders:
            with contextlib.suppress(FileExistsError):
                os.mkdir(path.parent, 0o700)
            self._folders.add(hour)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            if os.write(fd, data) != len(data):
                raise OSError("short write")
        finally:
            os.close(fd)
