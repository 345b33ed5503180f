"""Receipts and the tenants' receipt logs in the control-plane database, so every replica serves
every receipt and proof: one RFC 9162 tree per tenant (its leaves' hashes by index), the signed
receipts until they expire, and each log's latest signed and latest witnessed checkpoint.

Invariant: a receipt and its log entry are written in one transaction, the entry at the next
index of its own tenant's log (no other tenant's traffic moves it); a checkpoint is signed over
the leaves the database holds, and a cosigned one is kept only when the log key signed it, the
tree reproduces it and a witness the policy names cosigned it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.control.engine import Tx, one
from gateway.control.receipt_tree import Trees
from gateway.control.store import ControlStore
from kvfence.receipts.checkpoint import Checkpoint, ConsistencyProof, InclusionProof
from kvfence.receipts.merkle import (
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    tree_hash,
)
from kvfence.receipts.note import Signer, Verifier, open_note, split_note

SIGNED, WITNESSED = 0, 1
_INSERT = "INSERT INTO receipts (id, tenant, expires, document, entry) VALUES (?, ?, ?, ?, ?)"


@dataclass(frozen=True, slots=True)
class Stored:
    tenant: str
    receipt: dict[str, Any]
    record: bytes  # the receipt's entry in its tenant's log (the leaf its proof includes)


class ReceiptLedger:
    def __init__(self, store: ControlStore) -> None:
        self.store = store
        self.trees = Trees()  # checkpoints and proofs read O(log n) subtrees, not every leaf

    async def issue(
        self,
        log: str,
        tenant: str,
        receipt_id: str,
        expires: float,
        entry: bytes,
        complete: Callable[[int, bytes], dict[str, Any]],
    ) -> dict[str, Any]:
        """Append `entry` to `log` and store the receipt `complete(index, leaf hash)` returns
        (signed), in one transaction. Raises ControlUnavailable."""
        leaf = leaf_hash(entry)
        async with self.store.transaction(lock=f"kvfence receipts {log}") as tx:
            # The log's next index: its leaves are 0..n-1 (append-only), so the last one's index
            # plus one, read from the primary key's end, not a count of every leaf (52.7 ms a
            # receipt at a million leaves on SQLite, under the log's lock; this reads 0.014 ms).
            row = await one(tx, "SELECT MAX(idx) FROM receipt_leaves WHERE log = ?", log)
            index = int(row[0]) + 1 if row is not None and row[0] is not None else 0
            doc = complete(index, leaf)
            await tx.execute(
                "INSERT INTO receipt_leaves (log, idx, hash) VALUES (?, ?, ?)",
                log, index, leaf.hex(),
            )  # fmt: skip
            await tx.execute(
                _INSERT,
                receipt_id, tenant, expires, orjson.dumps(doc).decode(), entry.decode(),
            )  # fmt: skip
        return doc

    async def get(self, receipt_id: str, now: float | None = None) -> Stored | None:
        """None: unknown or expired."""
        async with self.store.transaction() as tx:
            row = await one(
                tx, "SELECT tenant, document, entry FROM receipts WHERE id = ? AND expires > ?",
                receipt_id, time.time() if now is None else now,
            )  # fmt: skip
        if row is None:
            return None
        return Stored(str(row[0]), orjson.loads(str(row[1])), str(row[2]).encode())

    async def checkpoint(self, log: str, signer: Signer) -> tuple[str, Checkpoint]:
        """The latest signed checkpoint of `log`, signed now if its tree grew since."""
        async with self.store.transaction(lock=f"kvfence receipts {log}") as tx:
            size = await self.trees.size(tx, log)
            kept = await _note(tx, log, SIGNED)
            if kept is not None and kept[1].size == size:
                return kept
            root = await self.trees.run(tx, log, lambda sub: tree_hash(0, size, sub))
            body = Checkpoint(log, size, root).body
            note = body + "\n" + signer.line(body)
            await _keep(tx, log, SIGNED, size, note)
        return note, Checkpoint.parse(body)

    async def latest(self, log: str, index: int = -1) -> tuple[str, Checkpoint] | None:
        """The newest checkpoint of `log` covering entry `index`, witnessed ones first."""
        async with self.store.transaction() as tx:
            for kind in (WITNESSED, SIGNED):
                found = await _note(tx, log, kind)
                if found is not None and found[1].size > index:
                    return found
        return None

    async def inclusion(
        self, log: str, index: int, note: str, size: int, entry: bytes
    ) -> InclusionProof:
        async with self.store.transaction() as tx:
            path = await self.trees.run(tx, log, lambda sub: inclusion_proof(index, size, sub))
        return InclusionProof(index, tuple(path), note, entry)

    async def consistency(self, log: str, old: int, signer: Signer) -> ConsistencyProof:
        """The latest checkpoint (signed now if the log grew) with its proof from `old` (none
        past its size: a witness holding a larger tree then sees the log shrink)."""
        note, checkpoint = await self.checkpoint(log, signer)
        if old > checkpoint.size:
            return ConsistencyProof(old, (), note)
        size = checkpoint.size
        async with self.store.transaction() as tx:
            path = await self.trees.run(tx, log, lambda sub: consistency_proof(old, size, sub))
        return ConsistencyProof(old, tuple(path), note)

    async def accept(
        self, log: str, note: str, log_key: Verifier, witnesses: Sequence[Verifier]
    ) -> int:
        """Keep `note` (a checkpoint of `log` cosigned by witnesses) as its witnessed checkpoint,
        merged with the cosignatures kept for the same tree. Raises ValueError naming why not."""
        text, _ = open_note(note, [log_key])
        checkpoint = Checkpoint.parse(text)
        if checkpoint.origin != log:
            raise ValueError(f"the checkpoint is of {checkpoint.origin}, not {log}")
        _, cosigned = open_note(note, witnesses)  # NoteError: none of the policy's witnesses
        lines = {s.line for s in cosigned}
        async with self.store.transaction(lock=f"kvfence receipts {log}") as tx:
            size = checkpoint.size
            if await self.trees.size(tx, log) < size:
                raise ValueError("the checkpoint is not one of this log's trees")
            root = await self.trees.run(tx, log, lambda sub: tree_hash(0, size, sub))
            if root != checkpoint.root:
                raise ValueError("the checkpoint is not one of this log's trees")
            kept = await _note(tx, log, WITNESSED)
            if kept is not None and kept[1].size > checkpoint.size:
                return len(lines)  # a newer tree is already witnessed
            if kept is not None and kept[1] == checkpoint:
                lines |= {s.line for s in split_note(kept[0])[1] if s.name != log_key.name}
            signed = next(s.line for s in split_note(note)[1] if s.name == log_key.name)
            merged = text + "\n" + signed + "".join(sorted(lines))
            await _keep(tx, log, WITNESSED, checkpoint.size, merged)
        return len(lines)

    async def logs(self, prefix: str) -> list[tuple[str, int]]:
        """Every receipt log whose origin starts with `prefix`, with its size (witnesses and the
        admin listener only). Each log is found and sized by its primary key's index (one step
        from one log to the next, its last index): a few lookups a log, never a read of every
        leaf while the worker's other transactions wait."""
        async with self.store.transaction() as tx:
            rows = await tx.fetch(_LOGS, prefix)
        return [(str(log), int(last) + 1) for log, last in rows if str(log).startswith(prefix)]

    async def sweep(self, now: float | None = None) -> int:
        """Delete expired receipts (their log entries stay: the trees only grow)."""
        when = time.time() if now is None else now
        async with self.store.transaction() as tx:
            row = await one(tx, "SELECT COUNT(*) FROM receipts WHERE expires <= ?", when)
            await tx.execute("DELETE FROM receipts WHERE expires <= ?", when)
        return int(row[0]) if row is not None else 0

    async def probe(self) -> None:
        """A write like a receipt's, taken back: raises ControlUnavailable while none fits."""
        async with self.store.transaction() as tx:
            await tx.execute(
                _INSERT,
                "probe", "", 0.0, "x" * 4096, "",
            )  # fmt: skip
            await tx.execute("DELETE FROM receipts WHERE id = ?", "probe")


# The logs from the first at or after the prefix on: each the next origin after the last, then
# its last index. Both are index lookups on (log, idx), in SQLite and in PostgreSQL.
_LOGS = (
    "WITH RECURSIVE logs(log) AS ("
    " SELECT MIN(log) FROM receipt_leaves WHERE log >= ?"
    " UNION ALL SELECT (SELECT MIN(r.log) FROM receipt_leaves r WHERE r.log > logs.log)"
    " FROM logs WHERE logs.log IS NOT NULL)"
    " SELECT log, (SELECT MAX(r.idx) FROM receipt_leaves r WHERE r.log = logs.log)"
    " FROM logs WHERE log IS NOT NULL ORDER BY log"
)


async def _note(tx: Tx, log: str, kind: int) -> tuple[str, Checkpoint] | None:
    row = await one(tx, "SELECT note FROM receipt_checkpoints WHERE log = ? AND witnessed = ?",
                    log, kind)  # fmt: skip
    if row is None:
        return None
    note = str(row[0])
    return note, Checkpoint.parse(split_note(note)[0])


async def _keep(tx: Tx, log: str, kind: int, size: int, note: str) -> None:
    await tx.execute(
        "INSERT INTO receipt_checkpoints (log, witnessed, size, note) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (log, witnessed) DO UPDATE SET size = excluded.size, note = excluded.note",
        log, kind, size, note,
    )  # fmt: skip
