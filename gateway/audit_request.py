"""The audit step of one request: its audit context, the verdict metric and record, and the
local answer that replaces a withheld response.

Invariant: a record that cannot be written raises `AuditWriteFailed`, so the response fails closed.
"""

from __future__ import annotations

import logging

from aiohttp import web

from gateway.audit import (
    VERDICT_HEADER,
    AttestationRefused,
    AuditContext,
    AuditWriteFailed,
    Outcome,
    Verdict,
    audit_record,
)
from gateway.audit_log import AuditWriteError
from gateway.audit_sink import AUDIT_SINK
from gateway.errors import GatewayError, error_body
from gateway.state import METRICS, NAMESPACE, REQUEST_ID, ROUTE, RUNTIME, TENANT, UPSTREAM_HEADERS

log = logging.getLogger("kvfence.gateway.audit")


def context(request: web.Request) -> AuditContext:
    backend = request[ROUTE].backend
    return AuditContext(
        backend=backend,
        upstream_id=request[UPSTREAM_HEADERS]["x-request-id"],
        namespace=request[NAMESPACE],
        verifier=request[RUNTIME].attestations.get(backend.name),
    )


async def audit(
    request: web.Request,
    ctx: AuditContext,
    outcome: Outcome,
    status: int,
    usage: tuple[int | None, int | None],
) -> None:
    """Count the verdict and write its record; AuditWriteFailed when the record is lost."""
    metrics = request.app[METRICS]
    metrics.child(metrics.verdicts, ctx.backend.name, outcome.verdict.value).inc()
    tenant = request[TENANT].id
    if usage[1]:
        metrics.child(metrics.cached_tokens, tenant).inc(usage[1])
    record = audit_record(
        request_id=request[REQUEST_ID],
        tenant=tenant,
        ctx=ctx,
        model=request[ROUTE].model.name,
        outcome=outcome,
        status=status,
        usage=usage,
    )
    if outcome.blocked or outcome.verdict not in (Verdict.CLEAN, Verdict.UNATTESTED):
        log.warning("audit verdict", extra={"rid": request[REQUEST_ID], **record})
    settings = request[RUNTIME].policy.gateway.audit_log
    try:
        await request.app[AUDIT_SINK].append(settings, record)
    except AuditWriteError as exc:
        metrics.audit_failures.inc()
        log.error("audit write failed", extra={"rid": request[REQUEST_ID], "error": str(exc)})
        raise AuditWriteFailed("the audit record could not be written") from None


def local_answer(request: web.Request, error: GatewayError, verdict: Verdict) -> web.Response:
    return web.Response(
        body=error_body(error),
        status=error.status,
        content_type="application/json",
        headers={"x-request-id": request[REQUEST_ID], VERDICT_HEADER: verdict.value},
    )


def refusal(outcome: Outcome) -> AttestationRefused:
    return AttestationRefused(
        f"the response was withheld: the backend's attestation verdict is {outcome.verdict.value}"
    )
