"""A witness (c2sp.org/tlog-cosignature): it cosigns a log's checkpoint only after checking that
it extends the last checkpoint it cosigned for that log, so a log that was rolled back or forked
(truncated and grown again) is refused, and anyone holding an older cosigned checkpoint can tell.

Invariant: the witness's state for a log (its last cosigned checkpoint) is saved, atomically,
before the new cosignature is handed out; sizes only grow and each new tree is proven to extend
the old one.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from kvfence.receipts.checkpoint import Checkpoint, ConsistencyProof, FormatError
from kvfence.receipts.merkle import ProofError, verify_consistency
from kvfence.receipts.note import COSIGNATURE, NoteError, Signer, Verifier, open_note, split_note


class WitnessError(Exception):
    """The checkpoint is refused: one line naming the log and what is wrong."""


@dataclass(frozen=True, slots=True)
class Cosigned:
    checkpoint: Checkpoint
    note: str  # the log's note with this witness's cosignature appended
    previous: int  # the size it extends (0: first seen)


class WitnessState:
    """One file per log (its origin, quoted) holding the last note this witness cosigned."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _path(self, origin: str) -> Path:
        return self.folder / (urllib.parse.quote(origin, safe="") + ".checkpoint")

    def last(self, origin: str) -> Checkpoint | None:
        try:
            note = self._path(origin).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        text, _ = split_note(note)
        return Checkpoint.parse(text)

    def save(self, origin: str, note: str) -> None:
        path = self._path(origin)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(note)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)


def _belongs(origin: str, log_key: Verifier) -> bool:
    """A log key signs its name's checkpoints and those of its workers' chains (NAME/wK)."""
    return origin == log_key.name or origin.startswith(log_key.name + "/")


def cosign(
    bundle: ConsistencyProof,
    log_key: Verifier,
    signer: Signer,
    state: WitnessState,
    now: int | None = None,
) -> Cosigned:
    """Check `bundle` (a signed checkpoint and its consistency proof from the size this witness
    last cosigned) and cosign it."""
    if signer.kind != COSIGNATURE:
        raise WitnessError("a witness signs with a cosignature (type 0x04) key")
    try:
        text, _ = open_note(bundle.note, [log_key])
        checkpoint = Checkpoint.parse(text)
    except (NoteError, FormatError) as exc:
        raise WitnessError(f"the checkpoint is not the log's: {exc}") from None
    origin = checkpoint.origin
    if not _belongs(origin, log_key):
        raise WitnessError(f"log {origin}: not a log of key {log_key.name}")
    previous = state.last(origin)
    if previous is not None:
        if checkpoint.size < previous.size:
            raise WitnessError(
                f"log {origin}: ROLLED BACK to {checkpoint.size} entries; this witness "
                f"cosigned {previous.size}"
            )
        if bundle.old != previous.size:
            raise WitnessError(
                f"log {origin}: the proof starts at {bundle.old}, this witness holds "
                f"{previous.size} (ask for old={previous.size})"
            )
        try:
            verify_consistency(
                previous.size, checkpoint.size, previous.root, checkpoint.root, bundle.path
            )
        except ProofError as exc:
            raise WitnessError(f"log {origin}: FORKED: {exc}") from None
    stamp = int(time.time()) if now is None else now
    note = bundle.note + signer.line(text, stamp)
    state.save(origin, note)
    return Cosigned(checkpoint, note, previous.size if previous is not None else 0)
