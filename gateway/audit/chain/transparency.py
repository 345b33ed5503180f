"""The chain as a witnessed log: its Merkle tree grows with every entry the writer appends, and
signed checkpoints (c2sp.org/tlog-checkpoint, a c2sp.org/signed-note by the log's key) are
written beside it, batched: at most one per `interval_s`, and only while it grows (one asked
for waits for the next). Beside
the chain: `FILE.tree`, `FILE.checkpoint` (the latest) and `FILE.witnessed` (the latest with
witnesses' cosignatures, which the gateway accepts on `POST /v1/kvfence/log/cosignature`).

Invariant: a checkpoint covers only entries already synced to disk, so a crash can never take
back what a checkpoint signed; at open, the active file's entries must be the tree's leaves and
the tree must reproduce the last checkpoint's root, or the log is refused.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gateway.audit.chain.chainfile import ChainFile
from gateway.audit.chain.lock import AuditWriteError
from gateway.audit.chain.tree import TreeFile, chain_lines, tree_path
from kvfence.receipts.checkpoint import Checkpoint, FormatError
from kvfence.receipts.merkle import leaf_hash
from kvfence.receipts.note import Signer, split_note

CHECKPOINT: Final = ".checkpoint"
WITNESSED: Final = ".witnessed"


@dataclass(frozen=True, slots=True)
class LogIdentity:
    """Who signs a chain's checkpoints and under which origin (the log's name; NAME/wK for
    worker K's chain)."""

    origin: str
    signer: Signer
    interval_s: float = 1.0


def checkpoint_path(path: Path) -> Path:
    return path.with_name(path.name + CHECKPOINT)


def witnessed_path(path: Path) -> Path:
    return path.with_name(path.name + WITNESSED)


def read_note(path: Path) -> tuple[str, Checkpoint] | None:
    """A checkpoint file's note and checkpoint (unverified: the gateway wrote it), or None."""
    try:
        note = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    text, _ = split_note(note)
    return note, Checkpoint.parse(text)


def write_note(path: Path, note: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    tmp.write_text(note, encoding="utf-8")
    os.replace(tmp, path)


class Transparency:
    """Used only by the chain's writer thread (and the log's constructor)."""

    def __init__(self, file: ChainFile, identity: LogIdentity) -> None:
        self.identity, self.path = identity, file.path
        self.tree = TreeFile(tree_path(file.path), writable=True)
        try:
            self._catch_up(file)
        except (OSError, ValueError, FormatError):
            self.tree.close()
            raise
        self.last_leaf = self.last_line = b""
        file.on_line = self._line
        found = read_note(checkpoint_path(self.path))
        ours = found is not None and found[1].origin == identity.origin
        self.note: str | None = found[0] if ours and found else None
        self.signed = found[1].size if ours and found else 0
        self.made = 0  # checkpoints signed since the log was opened
        self._due = time.monotonic() + identity.interval_s

    def _catch_up(self, file: ChainFile) -> None:
        """Bring the tree to the chain's length (entries written while it was not open, or a
        tree cut or lost), then check it against the last signed checkpoint."""
        entries, tree = file.seq, self.tree
        if tree.size > entries:
            tree.truncate(entries)
        if tree.size < entries:
            for line in chain_lines(self.path, tree.size):
                tree.append(line)
            tree.flush()
        self._check_leaves(file)
        found = read_note(checkpoint_path(self.path))
        if found is None:
            return
        signed = found[1]
        if signed.origin != self.identity.origin:
            return  # the log was renamed: its new checkpoints start a new log
        if signed.size > tree.size or tree.root(signed.size) != signed.root:
            raise AuditWriteError(
                f"audit log {self.path} no longer holds the {signed.size} entries its signed "
                "checkpoint covers: it was cut or rewritten; keep it as evidence"
            )

    def _check_leaves(self, file: ChainFile) -> None:
        """The active file's entries, hashed again, are the tree's leaves (an entry edited in
        place would otherwise keep its old leaf)."""
        first = file.seq - file.lines
        for seq, line in enumerate(chain_lines(self.path, first, active_only=True), first):
            if self.tree.hash_at(0, seq) != leaf_hash(line):
                raise AuditWriteError(
                    f"audit log {self.path}: entry {seq} is not the entry the log's tree and "
                    "signed checkpoints hold: it was edited; keep the log as evidence"
                )

    def _line(self, line: bytes) -> None:
        self.last_leaf, self.last_line = self.tree.append(line), line

    def timeout(self) -> float | None:
        """Seconds until a checkpoint is due, or None while nothing awaits one."""
        if self.tree.size <= self.signed:
            return None
        return max(0.0, self._due - time.monotonic())

    @property
    def current(self) -> bool:
        """Whether the latest checkpoint covers every entry."""
        return self.signed == self.tree.size and self.note is not None

    def after_sync(self, force: bool = False) -> None:
        """Called once the chain is synced: a checkpoint when one is due (or `force`: the log
        closes)."""
        if self.tree.size > self.signed and (force or time.monotonic() >= self._due):
            self.checkpoint()

    def checkpoint(self) -> str:
        self.tree.flush()
        body = Checkpoint(self.identity.origin, self.tree.size, self.tree.head()).body
        note = body + "\n" + self.identity.signer.line(body)
        write_note(checkpoint_path(self.path), note)
        self.signed, self.note, self.made = self.tree.size, note, self.made + 1
        self._due = time.monotonic() + self.identity.interval_s
        return note

    def close(self) -> None:
        self.tree.close()
