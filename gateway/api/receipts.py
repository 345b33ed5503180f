"""The tenant's receipt endpoints: `GET /v1/kvfence/receipts/{id}` (the signed receipt),
`GET /v1/kvfence/receipts/{id}/proof` (its record's c2sp.org/tlog-proof in the latest witnessed
checkpoint, or the latest signed one; one is made now when none covers it yet and the record is
in this worker's chain) and `GET /v1/kvfence/keys` (the key set that verifies them).

Invariant: a receipt and its proof are served only to the tenant the receipt was issued to; any
other request for an id (unknown, expired, another tenant's) gets the same 404.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

from aiohttp import web

from gateway.audit.chain.published import chain_of, inclusion, latest
from gateway.audit.sink import AUDIT_SINK
from gateway.errors import NotFound, ProofPending, ReceiptNotFound
from gateway.filters.authn import authenticate
from gateway.receipts.service import RECEIPTS
from gateway.receipts.store import Stored
from gateway.state import RUNTIME, TENANT
from kvfence.checkpoint import InclusionProof
from kvfence.receipt import AUDIT_LOG

_PROOF = "text/plain; charset=utf-8"


async def _owned(request: web.Request) -> Stored:
    await authenticate(request)
    store = request.app[RECEIPTS].store(request[RUNTIME].policy)
    if store is None:
        raise ReceiptNotFound()
    stored = await asyncio.to_thread(store.get, request.match_info["id"])
    tenant = request[TENANT].id
    if stored is None or not hmac.compare_digest(stored.tenant.encode(), tenant.encode()):
        raise ReceiptNotFound()
    return stored


async def get_receipt(request: web.Request) -> web.Response:
    stored = await _owned(request)
    return web.json_response(stored.receipt)


def _position(receipt: dict[str, Any]) -> tuple[str, int]:
    event = next(e for e in receipt["event_log"] if e.get("type") == AUDIT_LOG)
    return str(event["log"]), int(event["index"])


async def get_proof(request: web.Request) -> web.Response:
    stored = await _owned(request)
    origin, index = _position(stored.receipt)
    policy = request[RUNTIME].policy
    audit = policy.gateway.audit_log
    checkpoints = audit.checkpoints if audit is not None else None
    chain = None if checkpoints is None else chain_of(origin, checkpoints.name, audit.path)  # type: ignore[union-attr]
    if chain is None or checkpoints is None:
        raise ReceiptNotFound()  # the log it names is no longer this gateway's
    found = await asyncio.to_thread(latest, chain, index)
    sink = request.app[AUDIT_SINK]
    if found is None and chain.worker == sink.worker:
        await sink.checkpoint(audit)  # on demand: the record is in this worker's chain
        found = await asyncio.to_thread(latest, chain, index)
    if found is None:
        raise ProofPending(
            "no checkpoint covers this receipt's record yet: retry shortly",
            checkpoints.interval_s,
        )
    note, checkpoint = found
    proof: InclusionProof = await asyncio.to_thread(
        inclusion, chain, index, note, checkpoint.size, stored.record
    )
    return web.Response(text=proof.format(), content_type="text/plain", charset="utf-8")


async def get_keys(request: web.Request) -> web.Response:
    await authenticate(request)
    keys = request.app[RECEIPTS].keys(request[RUNTIME].policy)
    if keys is None:
        raise NotFound("this gateway issues no receipts")
    return web.Response(body=keys.document, content_type="application/json")


def add_receipt_routes(app: web.Application) -> None:
    app.router.add_get("/v1/kvfence/receipts/{id}", get_receipt)
    app.router.add_get("/v1/kvfence/receipts/{id}/proof", get_proof)
    app.router.add_get("/v1/kvfence/keys", get_keys)
