"""Editing the log: a record rewritten under a kept checkpoint stops the gateway from starting;
rewritten with the checkpoints made again (the operator holds every key), the tenant's receipt
no longer verifies against the log; `kvfence receipt verify` says so with its exit code."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson
import pytest

from gateway.audit.chain.lock import AuditWriteError
from kvfence.cli import main as kvfence
from kvfence.receipts.check import Root, verify
from kvfence.receipts.merkle import leaf_hash
from tests.fakes.openai_upstream import FakeUpstream
from tests.gateway.receipts.conftest import open_stack
from tests.gateway.receipts.test_receipts import CHAT, ask
from tests.kit.receipts import ReceiptKeys


def rewrite_entry(database: Path, receipt_id: str) -> None:
    """The operator rewrites the receipt's entry in its tenant's log, with its leaf, and drops the
    log's checkpoints (it holds the log key: the gateway signs new ones)."""
    with sqlite3.connect(database) as db:
        (entry,) = db.execute("SELECT entry FROM receipts WHERE id = ?", (receipt_id,)).fetchone()
        edited = entry.replace('"verdict":"unverified"', '"verdict":"verified"')
        assert edited != entry
        db.execute("UPDATE receipts SET entry = ? WHERE id = ?", (edited, receipt_id))
        db.execute("UPDATE receipt_leaves SET hash = ? WHERE hash = ?",
                   (leaf_hash(edited.encode()).hex(), leaf_hash(entry.encode()).hex()))  # fmt: skip
        db.execute("DELETE FROM receipt_checkpoints")


def rewrite_record(log: Path, receipt_id: str) -> None:
    lines = log.read_bytes().splitlines(keepends=True)
    for i, line in enumerate(lines):
        entry = orjson.loads(line)
        if entry.get("receipt_id") == receipt_id:
            entry["verdict"] = "verified"
            lines[i] = orjson.dumps(entry, option=orjson.OPT_SORT_KEYS) + b"\n"
    log.write_bytes(b"".join(lines))


async def test_a_rewritten_log_fails_the_tenants_check(
    receipt_keys: ReceiptKeys, upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with open_stack(receipt_keys, upstream) as stack:
        _, request, response, receipt_id = await ask(stack, "acme", CHAT)
        tenant = stack.tenant("acme")
        receipt, kept_proof = await tenant.receipt(receipt_id), await tenant.proof(receipt_id)
        keyset = await tenant.keyset()
    log = receipt_keys.folder / "log" / "audit.jsonl"
    rewrite_record(log, receipt_id)
    with pytest.raises(AuditWriteError, match=r"entry 1 is not the entry .* it was edited"):
        async with open_stack(receipt_keys, upstream):
            pass
    for suffix in (".tree", ".checkpoint"):  # the operator makes the tree and checkpoints anew
        log.with_name(log.name + suffix).unlink()
    rewrite_entry(receipt_keys.folder / "state" / "control.db", receipt_id)
    async with open_stack(receipt_keys, upstream) as stack:
        proof = await stack.tenant("acme").proof(receipt_id)
    root = Root(receipt_keys.log_key)
    report = verify(receipt, None, request=request, response=response, proof=proof, root=root)
    failed = {c.name: c.message for c in report.checks if not c.ok}
    assert set(failed) == {"log"}, report.checks
    assert "is not in the tree" in failed["log"] and "altered" in failed["log"]
    assert verify(receipt, None, proof=kept_proof, root=root).ok  # the tenant's copy proves it

    files = {"receipt": receipt, "keys": keyset and orjson.dumps(keyset.document())}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "response").write_bytes(response)
    (tmp_path / "proof").write_text(proof)
    (tmp_path / "kept-proof").write_text(kept_proof)
    argv = ["receipt", "verify", str(tmp_path / "receipt"), "--keys", str(tmp_path / "keys")]
    argv += ["--response", str(tmp_path / "response"), "--log-key", receipt_keys.log_key.vkey]
    assert kvfence([*argv, "--proof", str(tmp_path / "kept-proof")]) == 0
    assert kvfence([*argv, "--proof", str(tmp_path / "proof")]) == 1
    (tmp_path / "response").write_bytes(response + b" ")
    assert kvfence(argv) == 1
    assert kvfence([*argv, "--proof", str(tmp_path / "missing")]) == 2
