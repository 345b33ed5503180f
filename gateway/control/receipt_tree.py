"""The receipt logs' Merkle trees for checkpoints and proofs without reading or hashing every
leaf each time: the complete aligned subtrees a proof needs (`kvfence.receipts.merkle` asks for
nothing else) are hashed from leaves read by range, and those of `MEMO_LEAVES` leaves or more are
kept by this worker, keyed by their last leaf's hash.

Invariant: every hash comes from the leaves the database holds now: a kept subtree is used only
while the leaf at its end is the one it was hashed with (a log restored from an older backup and
grown again has other leaves there), and a range the database lacks leaves for is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

from gateway.control.engine import ControlRefused, Tx, one
from kvfence.receipts.merkle import Subtree, node_hash, root_of

T = TypeVar("T")
MEMO_LEAVES: Final = 256  # smaller subtrees are hashed from their leaves (under a ms)
MEMO_KEPT: Final = 65_536  # subtrees kept, every log together; started over when full


class Trees:
    """One worker's kept subtrees of every receipt log."""

    def __init__(self) -> None:
        self._kept: dict[tuple[str, int, int, bytes], bytes] = {}

    async def size(self, tx: Tx, log: str) -> int:
        row = await one(tx, "SELECT MAX(idx) FROM receipt_leaves WHERE log = ?", log)
        return int(row[0]) + 1 if row is not None and row[0] is not None else 0

    async def run(self, tx: Tx, log: str, build: Callable[[Subtree], T]) -> T:
        """`build` (a `merkle` function over a `Subtree`) over `log` as the database holds it:
        run once to learn which subtrees it asks for, then again with their hashes."""
        asked: set[tuple[int, int]] = set()

        def record(lo: int, hi: int) -> bytes:
            asked.add((lo, hi))
            return bytes(32)

        build(record)
        hashes = {(lo, hi): await self._subtree(tx, log, lo, hi) for lo, hi in sorted(asked)}
        return build(lambda lo, hi: hashes[(lo, hi)])

    async def _subtree(self, tx: Tx, log: str, lo: int, hi: int) -> bytes:
        if hi - lo < MEMO_LEAVES:
            return root_of(await _leaves(tx, log, lo, hi))
        (last,) = await _leaves(tx, log, hi - 1, hi)
        key = (log, lo, hi, last)
        kept = self._kept.get(key)
        if kept is None:
            mid = (lo + hi) // 2
            kept = node_hash(
                await self._subtree(tx, log, lo, mid), await self._subtree(tx, log, mid, hi)
            )
            if len(self._kept) >= MEMO_KEPT:
                self._kept.clear()
            self._kept[key] = kept
        return kept


async def _leaves(tx: Tx, log: str, lo: int, hi: int) -> list[bytes]:
    rows = await tx.fetch(
        "SELECT hash FROM receipt_leaves WHERE log = ? AND idx >= ? AND idx < ? ORDER BY idx",
        log, lo, hi,
    )  # fmt: skip
    if len(rows) != hi - lo:
        raise ControlRefused(f"the receipt log {log} lacks leaves between {lo} and {hi}")
    return [bytes.fromhex(str(r[0])) for r in rows]
