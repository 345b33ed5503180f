"""A tenant verifies the receipts of answers from our backend, plain and streamed, with the
`openai` client as the docs show it: the receipt id read from the raw response, the receipt and
its proof fetched with the tenant's own key, everything checked offline. The receipt carries
the attestation's evidence: the prompt's blocks, all the tenant's own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import openai
import orjson
import pytest

from backend.model.load import LoadedModel
from kvfence.receipts.receipt import RECEIPT_HEADER
from tests.kit.receipts import ReceiptKeys, Tenant, make_receipt_keys
from tests.kit.stack import Keys, Stack, make_backend, make_keys, running_stack

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "What is the capital of France? " * 12}]


@pytest.fixture
async def stack(smollm2: LoadedModel, tmp_path: Path) -> AsyncIterator[tuple[Stack, ReceiptKeys]]:
    keys: Keys = make_keys(tmp_path)
    folder = tmp_path / "receipts-keys"
    folder.mkdir()
    receipts = make_receipt_keys(folder)
    backend = make_backend(smollm2, keys)
    async with running_stack(backend, keys, smollm2.name, audit_log=receipts.gateway_lines()) as s:
        yield s, receipts


async def test_tenant_verifies_plain_and_streamed_receipts_from_our_backend(
    stack: tuple[Stack, ReceiptKeys], smollm2: LoadedModel
) -> None:
    s, receipts = stack
    client = openai.AsyncOpenAI(base_url=s.url + "/v1", api_key=s.keys.api_keys["acme"])
    tenant = Tenant(s.url, s.keys.api_keys["acme"], s.session, receipts.log_key)
    for _ in range(2):  # the second answer reuses the tenant's own cached blocks
        raw = await client.chat.completions.with_raw_response.create(
            model=smollm2.name,
            messages=MESSAGES,
            max_tokens=4,  # type: ignore[arg-type]
        )
        receipt_id = raw.headers[RECEIPT_HEADER]
        report = await tenant.verify(receipt_id, raw.http_request.content, raw.content)
        assert report.ok, [c for c in report.checks if not c.ok]
    doc = orjson.loads(await tenant.receipt(receipt_id))
    verdict = next(e for e in doc["event_log"] if e["type"] == "kvfence.verdict")
    evidence = verdict["evidence"]
    assert verdict["verdict"] == "clean" and evidence["kind"] == "attestation"
    assert evidence["attestation"].startswith("sha256:")
    assert evidence["blocks"] and {run["owner"] for run in evidence["blocks"]} == {"own"}
    assert verdict["cached_tokens"] == evidence["cached_tokens"] > 0
    assert doc["chat_id"] == orjson.loads(raw.content)["id"]

    async with client.chat.completions.with_streaming_response.create(
        model=smollm2.name,
        messages=MESSAGES,
        max_tokens=4,
        stream=True,  # type: ignore[arg-type]
    ) as streamed:
        receipt_id = streamed.headers[RECEIPT_HEADER]
        body = b"".join([chunk async for chunk in streamed.http_response.aiter_bytes()])
        request = streamed.http_request.content
    assert body.endswith(b"data: [DONE]\n\n")
    report = await tenant.verify(receipt_id, request, body)
    assert report.ok, report.checks
    other = Tenant(s.url, s.keys.api_keys["globex"], s.session)
    assert (await other.get(f"/v1/kvfence/receipts/{receipt_id}"))[0] == 404
    await client.close()
