"""Receipts settings: refused without the witnessed log or with no single active key; a
tenant's own settings; receipts expire with their hour, and expired ones are swept."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gateway.control.receipts import ReceiptLedger
from gateway.control.sqlite import SqliteEngine
from gateway.control.store import ControlStore
from gateway.policy.load import parse_policy
from gateway.policy.node import PolicyError
from gateway.receipts.store import HOUR, expiry_of, new_id
from tests.kit.gateway import ENV, policy_text
from tests.kit.receipts import ReceiptKeys, make_receipt_keys, with_receipts


def _parse(text: str, folder: Path) -> None:
    parse_policy(text, str(folder / "policy.yaml"), env=ENV, base=folder)


def test_receipts_need_checkpoints_and_one_active_key(tmp_path: Path) -> None:
    keys: ReceiptKeys = make_receipt_keys(tmp_path)
    good = with_receipts(policy_text("http://127.0.0.1:9"), keys)
    _parse(good, tmp_path)
    lines = good.split("\n")
    at = lines.index("    checkpoints:")
    without = "\n".join(lines[:at] + lines[at + 5 :])  # the audit log without its checkpoints
    with pytest.raises(PolicyError, match="receipts name their answer's record"):
        _parse(without, tmp_path)
    two_active = good.replace("r1.key}}", "r1.key}, active: true}")
    with pytest.raises(PolicyError, match="exactly one receipt key must be active"):
        _parse(two_active, tmp_path)
    own = "scope: tenant, receipts: {keep_s: 86400}, models: [smollm2]}"
    tenant_own = good.replace("scope: tenant, models: [smollm2]}", own, 1)
    tenants = parse_policy(tenant_own, "p.yaml", env=ENV, base=tmp_path).tenants
    assert tenants[0].receipts.keep_s == 86400 and tenants[1].receipts.enabled


async def test_receipts_expire_with_their_hour(tmp_path: Path) -> None:
    ledger = ReceiptLedger(ControlStore(SqliteEngine(tmp_path / "control.db")))
    receipt_id = new_id(keep_s=60)
    expires = float((expiry_of(receipt_id) or 0) * HOUR)
    doc = await ledger.issue(
        "log/tenant/a", "acme", receipt_id, expires, b"{}", lambda index, _: {"index": index}
    )
    assert (await ledger.get(receipt_id)) is not None
    later = time.time() + 2 * HOUR + 60
    assert doc["index"] == 0 and await ledger.get(receipt_id, now=later) is None
    assert await ledger.sweep(now=time.time()) == 0
    assert await ledger.sweep(now=later) == 1 and await ledger.get(receipt_id) is None
    await ledger.store.close()
