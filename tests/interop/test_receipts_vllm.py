"""A tenant verifies the receipts of answers from a real vLLM through the gateway, plain and
streamed: signature, request, the exact response bytes (SSE framing included), the record in
the log; the receipt names the salt-scoped namespace and the verification evidence."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from gateway.app import create_app
from gateway.policy.load import parse_policy
from gateway.server import bound_port, start
from kvfence.receipts.note import Verifier
from kvfence.receipts.receipt import RECEIPT_HEADER
from tests.interop.probes import fresh_prompt
from tests.interop.test_gateway_vllm import ENV, KEYS, policy_text
from tests.kit.receipts import Tenant, make_receipt_keys, with_receipts
from tests.kit.vllm_server import SERVED_MODEL

pytestmark = pytest.mark.vllm


@pytest.fixture
async def gateway(vllm_url: str, tmp_path: Path) -> AsyncIterator[tuple[str, Verifier]]:
    """The gateway's URL, and its log key as a tenant pins it."""
    receipts = make_receipt_keys(tmp_path)
    text = with_receipts(policy_text(vllm_url), receipts)
    app = create_app(parse_policy(text, str(tmp_path / "policy.yaml"), env=ENV, base=tmp_path))
    runner = await start(app, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{bound_port(runner)}", receipts.log_key
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_tenant_verifies_receipts_of_vllm_answers(
    gateway: tuple[str, Verifier], http: aiohttp.ClientSession, stream: bool
) -> None:
    gateway_url, log_key = gateway
    body = {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": fresh_prompt()}],
        "max_tokens": 4,
        "stream": stream,
    }
    request = orjson.dumps(body)
    headers = {"authorization": f"Bearer {KEYS['alpha']}", "content-type": "application/json"}
    async with http.post(
        gateway_url + "/v1/chat/completions", data=request, headers=headers
    ) as resp:
        assert resp.status == 200
        response, receipt_id = await resp.read(), resp.headers[RECEIPT_HEADER]
    tenant = Tenant(gateway_url, KEYS["alpha"], http, log_key)
    report = await tenant.verify(receipt_id, request, response)
    assert report.ok, [c for c in report.checks if not c.ok]
    doc = orjson.loads(await tenant.receipt(receipt_id))
    scope = next(e for e in doc["event_log"] if e["type"] == "kvfence.cache_scope")
    verdict = next(e for e in doc["event_log"] if e["type"] == "kvfence.verdict")
    assert scope["backend"] == {"name": "local-vllm", "kind": "vllm"}
    assert verdict["evidence"]["kind"] == "verification"
    assert (
        await Tenant(gateway_url, KEYS["beta"], http).get(f"/v1/kvfence/receipts/{receipt_id}")
    )[0] == 404
