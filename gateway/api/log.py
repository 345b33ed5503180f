"""The witnessed log's endpoints, for witnesses (any tenant's API key): `GET /v1/kvfence/log`
(its chains and their sizes), `GET /v1/kvfence/log/checkpoint?log=ORIGIN&old=N` (the latest
checkpoint with its consistency proof from N, as a c2sp.org/tlog-witness add-checkpoint body)
and `POST /v1/kvfence/log/cosignature?log=ORIGIN` (a witness hands back the checkpoint it
cosigned).

Invariant: the gateway keeps only cosignatures that verify under a witness key its policy names,
over a checkpoint its own log key signed and its own tree reproduces.
"""

from __future__ import annotations

import asyncio
from typing import Final

from aiohttp import web

from gateway.audit.chain.published import Chain, accept, chain_of, chains, consistency, latest
from gateway.audit.sink import AUDIT_SINK, log_signer
from gateway.errors import BadRequest, CosignatureRefused, LogNotFound
from gateway.filters.authn import authenticate
from gateway.policy.model import CheckpointSettings
from gateway.state import RUNTIME
from kvfence.note import Verifier

MAX_NOTE_BYTES: Final = 1 << 16


def _log(request: web.Request) -> tuple[CheckpointSettings, Chain | None]:
    audit = request[RUNTIME].policy.gateway.audit_log
    if audit is None or audit.checkpoints is None:
        raise LogNotFound("this gateway keeps no witnessed log")
    origin = request.query.get("log", audit.checkpoints.name)
    return audit.checkpoints, chain_of(origin, audit.checkpoints.name, audit.path)


async def list_logs(request: web.Request) -> web.Response:
    await authenticate(request)
    audit = request[RUNTIME].policy.gateway.audit_log
    if audit is None or audit.checkpoints is None:
        raise LogNotFound("this gateway keeps no witnessed log")
    found = await asyncio.to_thread(chains, audit.checkpoints.name, audit.path)
    logs = []
    for chain in found:
        signed = await asyncio.to_thread(latest, chain)
        logs.append({"origin": chain.origin, "size": signed[1].size if signed else 0})
    log_key = log_signer(audit.checkpoints).verifier.vkey
    return web.json_response({"log_key": log_key, "logs": logs})


async def get_checkpoint(request: web.Request) -> web.Response:
    await authenticate(request)
    _, chain = _log(request)
    try:
        old = int(request.query.get("old", "0"))
    except ValueError:
        raise BadRequest("old must be a tree size (a whole number)") from None
    if chain is None or old < 0:
        raise LogNotFound("no such log, or a negative size")
    sink = request.app[AUDIT_SINK]
    if chain.worker == sink.worker:  # this worker's chain: checkpointed now, on demand
        await sink.checkpoint(request[RUNTIME].policy.gateway.audit_log)
    bundle = await asyncio.to_thread(consistency, chain, old)
    if bundle is None:
        raise LogNotFound(f"log {chain.origin} has no checkpoint yet")
    return web.Response(text=bundle.format(), content_type="text/plain", charset="utf-8")


async def post_cosignature(request: web.Request) -> web.Response:
    await authenticate(request)
    settings, chain = _log(request)
    if chain is None:
        raise LogNotFound("no such log")
    body = await request.content.read(MAX_NOTE_BYTES + 1)
    if len(body) > MAX_NOTE_BYTES:
        raise CosignatureRefused("the cosigned checkpoint is too large")
    witnesses = [Verifier.parse(v) for v in settings.witnesses]
    if not witnesses:
        raise CosignatureRefused("this gateway's policy names no witnesses")
    try:
        note = body.decode("utf-8")
        await asyncio.to_thread(accept, chain, note, log_signer(settings).verifier, witnesses)
    except ValueError as exc:  # NoteError and FormatError are ValueErrors; so is bad UTF-8
        raise CosignatureRefused(f"cosignature refused: {exc}") from None
    return web.Response(status=204)


def add_log_routes(app: web.Application) -> None:
    app.router.add_get("/v1/kvfence/log", list_logs)
    app.router.add_get("/v1/kvfence/log/checkpoint", get_checkpoint)
    app.router.add_post("/v1/kvfence/log/cosignature", post_cosignature)
