"""What the witnessed log publishes, read from its files by any worker: each chain's latest
checkpoint and latest witnessed checkpoint, inclusion proofs (c2sp.org/tlog-proof) and
consistency proofs, and the witnesses' cosignatures it accepts. Blocking: call it off the loop.

Invariant: a cosigned checkpoint is kept only when the log's own key signed it, its root is the
tree's at that size, and a witness the policy names cosigned it; the witnessed checkpoint only
moves forward.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gateway.audit.chain.format import worker_path
from gateway.audit.chain.transparency import (
    checkpoint_path,
    read_note,
    witnessed_path,
    write_note,
)
from gateway.audit.chain.tree import TreeFile, tree_path
from kvfence.receipts.checkpoint import Checkpoint, ConsistencyProof, InclusionProof
from kvfence.receipts.note import NoteError, Verifier, open_note, split_note

_WORKER: Final = re.compile(r"^/w([1-9][0-9]{0,3})$")


@dataclass(frozen=True, slots=True)
class Chain:
    origin: str
    path: Path
    worker: int | None


def chain_of(origin: str, name: str, log_path: Path) -> Chain | None:
    """The chain a log origin names: NAME (a single process) or NAME/wK (worker K)."""
    if origin == name:
        return Chain(origin, log_path, None)
    match = _WORKER.fullmatch(origin[len(name) :]) if origin.startswith(name) else None
    if match is None:
        return None
    worker = int(match.group(1))
    return Chain(origin, worker_path(log_path, worker), worker)


def chains(name: str, log_path: Path) -> list[Chain]:
    """Every chain of the log (each worker's, by its active file)."""
    found = [Chain(name, log_path, None)]
    pattern = re.compile(rf"^{re.escape(log_path.stem)}\.w([0-9]+){re.escape(log_path.suffix)}$")
    if log_path.parent.is_dir():
        for file in sorted(log_path.parent.iterdir()):
            match = pattern.match(file.name)
            if match:
                found.append(Chain(f"{name}/w{int(match.group(1))}", file, int(match.group(1))))
    return [c for c in found if c.path.exists()]


def latest(chain: Chain, index: int = -1) -> tuple[str, Checkpoint] | None:
    """The newest checkpoint of `chain` covering entry `index`, witnessed ones first."""
    for path in (witnessed_path(chain.path), checkpoint_path(chain.path)):
        found = read_note(path)
        if found is not None and found[1].size > index and found[1].origin == chain.origin:
            return found
    return None


def inclusion(chain: Chain, index: int, note: str, size: int, record: bytes) -> InclusionProof:
    tree = TreeFile(tree_path(chain.path))
    try:
        return InclusionProof(index, tuple(tree.inclusion(index, size)), note, record)
    finally:
        tree.close()


def consistency(chain: Chain, old: int) -> ConsistencyProof | None:
    """The latest checkpoint with its proof from `old` (none past its size: a witness holding
    a larger tree then sees the log shrink)."""
    found = read_note(checkpoint_path(chain.path))
    if found is None:
        return None
    note, checkpoint = found
    if old > checkpoint.size:
        return ConsistencyProof(old, (), note)
    tree = TreeFile(tree_path(chain.path))
    try:
        return ConsistencyProof(old, tuple(tree.consistency(old, checkpoint.size)), note)
    finally:
        tree.close()


def accept(chain: Chain, note: str, log_key: Verifier, witnesses: Sequence[Verifier]) -> int:
    """Keep `note` (a checkpoint of `chain` cosigned by witnesses) as its witnessed checkpoint,
    merged with the cosignatures kept for the same tree. Returns how many witnesses cosigned.
    Raises ValueError (NoteError) naming why it is refused."""
    text, _ = open_note(note, [log_key])
    checkpoint = Checkpoint.parse(text)
    if checkpoint.origin != chain.origin:
        raise ValueError(f"the checkpoint is of {checkpoint.origin}, not {chain.origin}")
    tree = TreeFile(tree_path(chain.path))
    try:
        if tree.flushed < checkpoint.size or tree.root(checkpoint.size) != checkpoint.root:
            raise ValueError("the checkpoint is not one of this log's trees")
    finally:
        tree.close()
    _, cosigned = open_note(note, witnesses)  # NoteError: none of the policy's witnesses
    kept = read_note(witnessed_path(chain.path))
    lines = {s.line for s in cosigned}
    if kept is not None:
        if kept[1].size > checkpoint.size:
            return len(lines)  # a newer tree is already witnessed
        if kept[1] == checkpoint:
            lines |= {s.line for s in split_note(kept[0])[1] if s.name != log_key.name}
    signed = next(s.line for s in split_note(note)[1] if s.name == log_key.name)
    write_note(witnessed_path(chain.path), text + "\n" + signed + "".join(sorted(lines)))
    return len(lines)


__all__ = ["Chain", "NoteError", "accept", "chain_of", "chains", "consistency", "latest"]
