"""The witnessed logs' endpoints: `GET /v1/kvfence/log` (the logs and their sizes), `GET
/v1/kvfence/log/checkpoint?log=ORIGIN&old=N` (the latest checkpoint with its consistency proof
from N, as a c2sp.org/tlog-witness add-checkpoint body) and `POST
/v1/kvfence/log/cosignature?log=ORIGIN` (a witness hands back the checkpoint it cosigned). On
the tenant listener a tenant's key reaches only its own receipt log; the admin listener serves
every tenant's receipt log and the audit log's chains, for the operator's witnesses.

Invariant: nothing a tenant's key reads here depends on another tenant's traffic; the gateway
keeps only cosignatures that verify under a witness key its policy names, over a checkpoint its
own log key signed and its own tree reproduces.
"""

from __future__ import annotations

import asyncio
from typing import Final

from aiohttp import web

from gateway.audit.chain.published import Chain, accept, chain_of, chains, consistency, latest
from gateway.audit.sink import AUDIT_SINK, log_signer
from gateway.control.engine import ControlRefused, ControlUnavailable
from gateway.errors import BadRequest, CosignatureRefused, LogNotFound
from gateway.filters.authn import authenticate
from gateway.policy.model import AuditLogSettings, CheckpointSettings, Policy
from gateway.policy.reload import HOLDER
from gateway.receipts.service import RECEIPTS, tenant_log
from gateway.state import RUNTIME, TENANT
from kvfence.receipts.note import Verifier

MAX_NOTE_BYTES: Final = 1 << 16
RECEIPT_LOGS: Final = "/tenant/"


def _settings(policy: Policy) -> CheckpointSettings:
    audit = policy.gateway.audit_log
    if audit is None or audit.checkpoints is None:
        raise LogNotFound("this gateway keeps no witnessed log")
    return audit.checkpoints


def _old(request: web.Request) -> int:
    try:
        old = int(request.query.get("old", "0"))
    except ValueError:
        raise BadRequest("old must be a tree size (a whole number)") from None
    if old < 0:
        raise LogNotFound("no such log, or a negative size")
    return old


async def _own(request: web.Request) -> tuple[web.Application, Policy, CheckpointSettings, str]:
    """The tenant's receipt log: the only one its key reaches (another origin is not found)."""
    await authenticate(request)
    policy = request[RUNTIME].policy
    settings = _settings(policy)
    own = tenant_log(settings.name, request[TENANT].id)
    if request.query.get("log", own) != own:
        raise LogNotFound("no such log")
    return request.app, policy, settings, own


async def list_logs(request: web.Request) -> web.Response:
    app, policy, settings, own = await _own(request)
    _, checkpoint = await _signed(app, policy, own)
    logs = [{"origin": own, "size": checkpoint}]
    return web.json_response({"log_key": log_signer(settings).verifier.vkey, "logs": logs})


async def _signed(app: web.Application, policy: Policy, origin: str) -> tuple[str, int]:
    signer = app[RECEIPTS].signer(policy)
    assert signer is not None, "checked by _settings"
    try:
        note, checkpoint = await app[RECEIPTS].ledger.checkpoint(origin, signer)
    except (ControlUnavailable, ControlRefused) as exc:
        raise LogNotFound(f"the receipt log cannot be read now: {exc}") from None
    return note, checkpoint.size


async def get_checkpoint(request: web.Request) -> web.Response:
    app, policy, _, own = await _own(request)
    return await _receipt_checkpoint(app, policy, own, _old(request))


async def _receipt_checkpoint(
    app: web.Application, policy: Policy, origin: str, old: int
) -> web.Response:
    signer = app[RECEIPTS].signer(policy)
    assert signer is not None
    try:
        bundle = await app[RECEIPTS].ledger.consistency(origin, old, signer)
    except (ControlUnavailable, ControlRefused) as exc:
        raise LogNotFound(f"the receipt log cannot be read now: {exc}") from None
    return web.Response(text=bundle.format(), content_type="text/plain", charset="utf-8")


async def _note(request: web.Request, settings: CheckpointSettings) -> tuple[str, list[Verifier]]:
    body = await request.content.read(MAX_NOTE_BYTES + 1)
    if len(body) > MAX_NOTE_BYTES:
        raise CosignatureRefused("the cosigned checkpoint is too large")
    witnesses = [Verifier.parse(v) for v in settings.witnesses]
    if not witnesses:
        raise CosignatureRefused("this gateway's policy names no witnesses")
    try:
        return body.decode("utf-8"), witnesses
    except ValueError:
        raise CosignatureRefused("cosignature refused: the note is not UTF-8") from None


async def post_cosignature(request: web.Request) -> web.Response:
    app, _, settings, own = await _own(request)
    return await _receipt_cosignature(request, app, settings, own)


async def _receipt_cosignature(
    request: web.Request, app: web.Application, settings: CheckpointSettings, origin: str
) -> web.Response:
    note, witnesses = await _note(request, settings)
    try:
        await app[RECEIPTS].ledger.accept(origin, note, log_signer(settings).verifier, witnesses)
    except ValueError as exc:  # NoteError and FormatError are ValueErrors
        raise CosignatureRefused(f"cosignature refused: {exc}") from None
    except (ControlUnavailable, ControlRefused) as exc:
        raise LogNotFound(f"the receipt log cannot be written now: {exc}") from None
    return web.Response(status=204)


def add_log_routes(app: web.Application) -> None:
    app.router.add_get("/v1/kvfence/log", list_logs)
    app.router.add_get("/v1/kvfence/log/checkpoint", get_checkpoint)
    app.router.add_post("/v1/kvfence/log/cosignature", post_cosignature)


# The admin listener's view: every receipt log and every chain of the audit log.


async def admin_list_logs(request: web.Request, app: web.Application) -> web.Response:
    policy = _policy(app)
    settings = _settings(policy)
    audit = policy.gateway.audit_log
    assert audit is not None
    logs = []
    for chain in await asyncio.to_thread(chains, settings.name, audit.path):
        signed = await asyncio.to_thread(latest, chain)
        logs.append({"origin": chain.origin, "size": signed[1].size if signed else 0})
    try:
        receipt_logs = await app[RECEIPTS].ledger.logs(settings.name + RECEIPT_LOGS)
    except (ControlUnavailable, ControlRefused) as exc:
        raise LogNotFound(f"the receipt logs cannot be read now: {exc}") from None
    logs += [{"origin": origin, "size": size} for origin, size in receipt_logs]
    return web.json_response({"log_key": log_signer(settings).verifier.vkey, "logs": logs})


def _policy(app: web.Application) -> Policy:
    return app[HOLDER].runtime.policy


def _audit_chain(policy: Policy, name: str, origin: str) -> tuple[AuditLogSettings, Chain]:
    """The policy's audit log and the chain of it that `origin` names (404 when none)."""
    audit = policy.gateway.audit_log
    assert audit is not None
    chain = chain_of(origin, name, audit.path)
    if chain is None:
        raise LogNotFound("no such log")
    return audit, chain


async def admin_checkpoint(request: web.Request, app: web.Application) -> web.Response:
    policy = _policy(app)
    settings = _settings(policy)
    origin, old = request.query.get("log", settings.name), _old(request)
    if origin.startswith(settings.name + RECEIPT_LOGS):
        return await _receipt_checkpoint(app, policy, origin, old)
    audit, chain = _audit_chain(policy, settings.name, origin)
    sink = app[AUDIT_SINK]
    if chain.worker == sink.worker:  # this worker's chain: checkpointed now, on demand
        await sink.checkpoint(audit)
    bundle = await asyncio.to_thread(consistency, chain, old)
    if bundle is None:
        raise LogNotFound(f"log {chain.origin} has no checkpoint yet")
    return web.Response(text=bundle.format(), content_type="text/plain", charset="utf-8")


async def admin_cosignature(request: web.Request, app: web.Application) -> web.Response:
    policy = _policy(app)
    settings = _settings(policy)
    origin = request.query.get("log", settings.name)
    if origin.startswith(settings.name + RECEIPT_LOGS):
        return await _receipt_cosignature(request, app, settings, origin)
    _, chain = _audit_chain(policy, settings.name, origin)
    note, witnesses = await _note(request, settings)
    try:
        await asyncio.to_thread(accept, chain, note, log_signer(settings).verifier, witnesses)
    except ValueError as exc:
        raise CosignatureRefused(f"cosignature refused: {exc}") from None
    return web.Response(status=204)
