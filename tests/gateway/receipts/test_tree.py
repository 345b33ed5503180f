"""The receipt logs' checkpoints and proofs at sizes where whole subtrees are kept by the worker:
they match the tree over every leaf, the second proof reads a few leaves instead of the log, and a
log restored from an older backup and grown again is hashed from its new leaves, not the kept."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.control import receipt_tree
from gateway.control.receipts import ReceiptLedger
from gateway.control.sqlite import SqliteEngine
from gateway.control.store import ControlStore
from kvfence.receipts.merkle import leaf_hash, root_of, verify_consistency, verify_inclusion
from kvfence.receipts.note import ED25519, Signer

LOG = "gateway.example/receipts/acme"
SIZE = 5_000  # subtrees of 256 leaves and more are kept (MEMO_LEAVES)
SIGNER = Signer("gateway.example/receipts", ED25519, Ed25519PrivateKey.generate())


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[ReceiptLedger]:
    store = ControlStore(SqliteEngine(tmp_path / "control.db"))
    await store.migrate()
    yield ReceiptLedger(store)
    await store.close()


async def put_leaves(ledger: ReceiptLedger, start: int, leaves: list[bytes]) -> None:
    async with ledger.store.transaction(lock="test") as tx:
        await tx.execute("DELETE FROM receipt_leaves WHERE log = ? AND idx >= ?", LOG, start)
        for i, leaf in enumerate(leaves, start):
            await tx.execute(
                "INSERT INTO receipt_leaves (log, idx, hash) VALUES (?, ?, ?)", LOG, i, leaf.hex()
            )


def counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many leaves each range read returned."""
    read: list[int] = []
    real = receipt_tree._leaves

    async def leaves(*args: object) -> list[bytes]:
        got = await real(*args)  # type: ignore[arg-type]
        read.append(len(got))
        return got

    monkeypatch.setattr(receipt_tree, "_leaves", leaves)
    return read


async def test_proofs_match_the_whole_tree_and_read_a_few_leaves_once_kept(
    ledger: ReceiptLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    leaves = [leaf_hash(f"entry {i}".encode()) for i in range(SIZE)]
    await put_leaves(ledger, 0, leaves)
    read = counting(monkeypatch)
    note, checkpoint = await ledger.checkpoint(LOG, SIGNER)
    assert (checkpoint.size, checkpoint.root) == (SIZE, root_of(leaves))
    assert sum(read) >= SIZE  # the first time, every leaf once
    for index in (0, 255, 256, 511, 512, 700, 4095, 4096, SIZE - 1):
        read.clear()
        proof = await ledger.inclusion(LOG, index, note, SIZE, b"entry")
        verify_inclusion(leaves[index], index, SIZE, proof.path, checkpoint.root)
        # Its own block's leaves and the log's ragged end, never the kept subtrees' leaves.
        assert sum(read) < 3 * receipt_tree.MEMO_LEAVES
    for old in (1, 300, 512, 999, 4096, SIZE):
        bundle = await ledger.consistency(LOG, old, SIGNER)
        verify_consistency(old, SIZE, root_of(leaves[:old]), checkpoint.root, bundle.path)


async def test_a_log_restored_and_grown_again_is_hashed_from_its_new_leaves(
    ledger: ReceiptLedger,
) -> None:
    leaves = [leaf_hash(f"entry {i}".encode()) for i in range(SIZE)]
    await put_leaves(ledger, 0, leaves)
    _, before = await ledger.checkpoint(LOG, SIGNER)
    regrown = leaves[:3000] + [leaf_hash(f"other {i}".encode()) for i in range(3000, SIZE + 24)]
    await put_leaves(ledger, 3000, regrown[3000:])
    _, after = await ledger.checkpoint(LOG, SIGNER)
    assert (after.size, after.root) == (SIZE + 24, root_of(regrown))
    assert after.root != before.root
