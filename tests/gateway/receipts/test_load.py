"""Receipts under load: many concurrent plain and streamed answers for two tenants, and no
answer without a receipt: every answer names a distinct receipt, every receipt is stored,
verifies against the bytes its tenant got, and names its own entry in its tenant's log."""

from __future__ import annotations

import asyncio
import base64
import sqlite3
import time
from collections.abc import AsyncIterator

import orjson
import pytest

from gateway.audit.sink import AUDIT_SINK
from gateway.receipts.service import tenant_log
from kvfence.receipts.check import Root, verify
from kvfence.receipts.checkpoint import Checkpoint, InclusionProof
from kvfence.receipts.note import split_note
from tests.fakes.openai_upstream import FakeUpstream
from tests.gateway.receipts.conftest import Stack, open_stack
from tests.gateway.receipts.test_receipts import CHAT, ask
from tests.kit.receipts import LOG_NAME, ReceiptKeys

ANSWERS = 120


@pytest.fixture
async def stack(receipt_keys: ReceiptKeys, upstream: FakeUpstream) -> AsyncIterator[Stack]:
    async with open_stack(receipt_keys, upstream) as opened:
        yield opened


async def test_every_answer_has_its_receipt_under_load(stack: Stack) -> None:
    tenants = ["acme", "globex"] * (ANSWERS // 2)
    sink, began = stack.gw.app[AUDIT_SINK], time.monotonic()
    made = sink.checkpoints
    results = await asyncio.gather(
        *(ask(stack, t, {**CHAT, "stream": i % 2 == 0}) for i, t in enumerate(tenants))
    )
    ids = [receipt_id for _, _, _, receipt_id in results]
    assert [status for status, *_ in results] == [200] * ANSWERS
    assert all(ids) and len(set(ids)) == ANSWERS
    with sqlite3.connect(stack.keys.folder / "state" / "control.db") as db:
        (stored,) = db.execute("SELECT COUNT(*) FROM receipts").fetchone()
    assert stored == ANSWERS
    records = [
        orjson.loads(line)
        for line in (stack.keys.folder / "log" / "audit.jsonl").read_bytes().splitlines()
    ]
    answers = [r for r in records if r.get("kind") == "record"]
    final = [r for r in answers if r["phase"] == "final"]
    assert sorted(r["receipt_id"] for r in final) == sorted(ids)  # the receipt names this one
    streamed = sum(1 for i in range(len(tenants)) if i % 2 == 0)
    assert len(answers) - len(final) == streamed  # each stream's record opened before its bytes
    root, indexes = Root(stack.keys.log_key), set()
    for tenant, (_, request, response, receipt_id) in zip(tenants, results, strict=True):
        client = stack.tenant(tenant)
        receipt, proof = await client.receipt(receipt_id), await client.proof(receipt_id)
        report = verify(receipt, None, request=request, response=response, proof=proof, root=root)
        assert report.ok, report.checks
        parsed = InclusionProof.parse(proof)
        origin = Checkpoint.parse(split_note(parsed.note)[0]).origin
        assert origin == tenant_log(LOG_NAME, tenant)  # its own tenant's log
        indexes.add((origin, parsed.index))
        record = orjson.loads(base64.b64decode(proof.split("\n")[1][6:]))
        assert record["receipt_id"] == receipt_id
    assert len(indexes) == ANSWERS  # each names an entry of its own
    assert {i for _, i in indexes} == set(range(ANSWERS // 2))  # each log counts its own
    # Batched: never one per answer or per proof, at most one per interval (0.2 s here).
    intervals = (time.monotonic() - began) / 0.2
    assert sink.checkpoints - made <= intervals + 1
