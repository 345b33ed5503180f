"""The tenant's receipt endpoints: `GET /v1/kvfence/receipts/{id}` (the signed receipt),
`GET /v1/kvfence/receipts/{id}/proof` (its entry's c2sp.org/tlog-proof in its tenant's receipt
log, in the latest witnessed checkpoint, or the latest signed one; one is signed now when none
covers it yet), from the control database, so any replica serves any receipt, and
`GET /v1/kvfence/keys` (the key set that verifies them).

Invariant: a receipt and its proof are served only to the tenant the receipt was issued to; any
other request for an id (unknown, expired, another tenant's) gets the same 404.
"""

from __future__ import annotations

import hmac
from typing import Any

from aiohttp import web

from gateway.control.engine import ControlRefused, ControlUnavailable
from gateway.control.receipts import Stored
from gateway.errors import NotFound, ProofPending, ReceiptNotFound
from gateway.filters.authn import authenticate
from gateway.receipts.service import RECEIPTS
from gateway.receipts.store import expiry_of
from gateway.state import RUNTIME, TENANT
from kvfence.receipts.receipt import AUDIT_LOG

_PROOF = "text/plain; charset=utf-8"


async def _owned(request: web.Request) -> Stored:
    await authenticate(request)
    if request[RUNTIME].policy.gateway.receipts is None:
        raise ReceiptNotFound()
    receipt_id = request.match_info["id"]
    try:
        stored = (
            await request.app[RECEIPTS].ledger.get(receipt_id) if expiry_of(receipt_id) else None
        )
    except (ControlUnavailable, ControlRefused):
        raise ProofPending("receipts cannot be read now: retry shortly", 1.0) from None
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
    receipts = request.app[RECEIPTS]
    signer = receipts.signer(request[RUNTIME].policy)
    if signer is None:
        raise ReceiptNotFound()  # the gateway keeps no witnessed log any more
    try:
        found = await receipts.ledger.latest(origin, index)
        if found is None:  # on demand: the record's own log, signed now
            found = await receipts.ledger.checkpoint(origin, signer)
        note, checkpoint = found
        proof = await receipts.ledger.inclusion(origin, index, note, checkpoint.size, stored.record)
    except (ControlUnavailable, ControlRefused):
        raise ProofPending("receipts cannot be read now: retry shortly", 1.0) from None
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
