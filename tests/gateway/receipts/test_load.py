"""Receipts under load: many concurrent plain and streamed answers for two tenants, and no
answer without a receipt: every answer names a distinct receipt, every receipt is stored,
verifies against the bytes its tenant got, and names its own record in the log."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator

import orjson
import pytest

from gateway.audit.sink import AUDIT_SINK
from kvfence.checkpoint import InclusionProof
from kvfence.receipt_check import verify
from tests.fakes.openai_upstream import FakeUpstream
from tests.gateway.receipts.conftest import Stack, open_stack
from tests.gateway.receipts.test_receipts import CHAT, ask
from tests.kit.receipts import ReceiptKeys

ANSWERS = 120


@pytest.fixture
async def stack(receipt_keys: ReceiptKeys, upstream: FakeUpstream) -> AsyncIterator[Stack]:
    async with open_stack(receipt_keys, upstream, patient=True) as opened:
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
    stored = list((stack.keys.folder / "receipts").glob("*/*.json"))
    assert len(stored) == ANSWERS
    records = [
        orjson.loads(line)
        for line in (stack.keys.folder / "log" / "audit.jsonl").read_bytes().splitlines()
    ]
    answers = [r for r in records if r.get("kind") == "record"]
    final = [r for r in answers if r["phase"] == "final"]
    assert sorted(r["receipt_id"] for r in final) == sorted(ids)  # the receipt names this one
    streamed = sum(1 for i in range(len(tenants)) if i % 2 == 0)
    assert len(answers) - len(final) == streamed  # each stream's record opened before its bytes
    keyset = await stack.tenant("acme").keyset()
    indexes = set()
    for tenant, (_, request, response, receipt_id) in zip(tenants, results, strict=True):
        client = stack.tenant(tenant)
        receipt, proof = await client.receipt(receipt_id), await client.proof(receipt_id)
        report = verify(receipt, keyset, request=request, response=response, proof=proof)
        assert report.ok, report.checks
        indexes.add(InclusionProof.parse(proof).index)
        record = orjson.loads(base64.b64decode(proof.split("\n")[1][6:]))
        assert record["receipt_id"] == receipt_id and record["tenant"] == tenant
    assert len(indexes) == ANSWERS  # each names a record of its own
    # Batched: never one per answer or per proof, at most one per interval (0.2 s here).
    intervals = (time.monotonic() - began) / 0.2
    assert sink.checkpoints - made <= intervals + 1
