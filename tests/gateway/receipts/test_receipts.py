"""A tenant verifies the receipt of each of its answers, plain and streamed, success and
failure: the signature, the request and the exact response bytes, the record in the log. Any
other key gets 404; any edit to the receipt or the response breaks verification."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from kvfence.receipts.check import Root, verify
from kvfence.receipts.receipt import RECEIPT_HEADER
from tests.gateway.receipts.conftest import Stack

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hello"}]}


async def ask(stack: Stack, tenant: str, body: dict[str, Any]) -> tuple[int, bytes, bytes, str]:
    """Status, request bytes, response bytes, receipt id."""
    data = orjson.dumps(body)
    headers = {**stack.gw.auth(tenant), "content-type": "application/json"}
    async with stack.gw.session.post(
        stack.gw.url + "/v1/chat/completions", data=data, headers=headers
    ) as resp:
        return resp.status, data, await resp.read(), resp.headers.get(RECEIPT_HEADER, "")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_tenant_verifies_its_receipt(stack: Stack, stream: bool) -> None:
    status, request, response, receipt_id = await ask(stack, "acme", {**CHAT, "stream": stream})
    assert status == 200 and receipt_id
    if stream:
        assert response.endswith(b"data: [DONE]\n\n")  # the digest covers the SSE framing
    report = await stack.tenant("acme").verify(receipt_id, request, response)
    assert report.ok, report.checks
    assert [c.name for c in report.checks] == [
        "signature",
        "request",
        "response",
        "log",
        "record",
        "keys",
    ]
    doc = orjson.loads(await stack.tenant("acme").receipt(receipt_id))
    scope = next(e for e in doc["event_log"] if e["type"] == "kvfence.cache_scope")
    assert scope["partition"] == "gateway-enforced" and scope["scope"] == "tenant"
    assert b"hello" not in orjson.dumps(doc)  # no prompt text in a receipt


async def test_failed_answers_have_receipts_of_what_the_client_got(stack: Stack) -> None:
    stack.gw.upstream.mode = "die_mid"
    status, request, response, receipt_id = await ask(stack, "acme", {**CHAT, "stream": True})
    assert status == 200 and b"event: error" in response and b"[DONE]" not in response
    report = await stack.tenant("acme").verify(receipt_id, request, response)
    assert report.ok, report.checks
    stack.gw.upstream.mode = "die_before"
    status, request, response, receipt_id = await ask(stack, "acme", CHAT)
    assert status == 502 and receipt_id
    report = await stack.tenant("acme").verify(receipt_id, request, response)
    assert report.ok, report.checks
    verdict = next(
        e
        for e in orjson.loads(await stack.tenant("acme").receipt(receipt_id))["event_log"]
        if e["type"] == "kvfence.verdict"
    )
    assert (verdict["status"], verdict["upstream_status"]) == (502, 0)


async def test_other_keys_unknown_and_expired_ids_are_all_404(stack: Stack) -> None:
    _, _, _, receipt_id = await ask(stack, "acme", CHAT)
    answers = []
    for tenant, rid in [
        ("globex", receipt_id),
        ("globex", receipt_id + "/proof"),
        ("acme", "rcpt_1_" + "0" * 32),  # expired in 1970
        ("acme", "rcpt_ffffff_" + "0" * 32),  # never issued
        ("acme", "../../etc/passwd"),
    ]:
        answers.append(await stack.tenant(tenant).get(f"/v1/kvfence/receipts/{rid}"))
    assert {status for status, _ in answers} == {404}
    assert len({body for _, body in answers if b"receipt_not_found" in body}) == 1
    status, _ = await stack.tenant("acme").get(f"/v1/kvfence/receipts/{receipt_id}")
    assert status == 200


async def test_a_tenant_with_receipts_off_gets_none(stack: Stack) -> None:
    body = {**CHAT, "prompt_cache_key": "session-1"}
    status, _, _, receipt_id = await ask(stack, "umbrella", body)
    assert status == 200 and receipt_id == ""


def _leaves(doc: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            yield from _leaves(value, (*path, index))
    else:
        yield path


def _edit(doc: Any, path: tuple[Any, ...]) -> Any:
    edited = copy.deepcopy(doc)
    *parents, last = path
    target = edited
    for key in parents:
        target = target[key]
    value = target[last]
    target[last] = (
        (not value)
        if isinstance(value, bool)
        else value + 1
        if isinstance(value, int)
        else "edited"
        if value != "edited"
        else "x"
    )
    return edited


async def test_editing_any_field_or_byte_breaks_verification(stack: Stack) -> None:
    _, request, response, receipt_id = await ask(stack, "acme", {**CHAT, "stream": True})
    tenant = stack.tenant("acme")
    receipt, proof = await tenant.receipt(receipt_id), await tenant.proof(receipt_id)
    keyset = await tenant.keyset()
    doc = orjson.loads(receipt)
    paths = [p for p in _leaves(doc) if p != ("signature", "algo")]
    assert len(paths) > 40
    for path in paths:
        report = verify(orjson.dumps(_edit(doc, path)), keyset, root=Root(stack.keys.log_key))
        assert not report.ok, path
        (check,) = report.checks
        structural = path[-1] in ("seq", "type", "api_version", "key_id", "value")
        if not structural:
            assert "does not verify: the receipt was edited" in check.message, (path, check)
        assert check.message and "\n" not in check.message, path  # one clear line
    edited = response.replace(b"chatcmpl-fake", b"chatcmpl-fakf", 1)
    root = Root(stack.keys.log_key)
    report = verify(receipt, keyset, request=request, response=edited, proof=proof, root=root)
    failed = [c for c in report.checks if not c.ok]
    assert [c.name for c in failed] == ["response"]
    assert "edited, or another answer's" in failed[0].message
