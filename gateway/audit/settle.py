"""Settle: the one place a judgement becomes what the client gets and one audit record: the
verdict is counted, logged when it is not clean, traced (with `gateway.tracing`), and written to
the audit log; a violation is reported to the watch; a withheld answer is replaced by a local
error. Only the exchange calls it.

Invariant: every request that reached the upstream step is settled exactly once; a record that
cannot be written raises `AuditWriteFailed`, so the answer fails closed.
"""

from __future__ import annotations

import logging
from typing import Final

from aiohttp import web

from gateway.audit.chain.log import AuditWriteError
from gateway.audit.judge import Answer, AuditContext, Judgement, record
from gateway.audit.sink import AUDIT_SINK
from gateway.audit.trace import TRACES
from gateway.errors import AttestationRefused, AuditWriteFailed, error_response
from gateway.metrics import METRICS, Metrics
from gateway.state import RUNTIME, USED_TOKENS
from gateway.verify.watch import WATCH
from kvfence.verdict import VERDICT_HEADER as VERDICT_HEADER
from kvfence.verdict import Verdict

_QUIET: Final = frozenset({Verdict.CLEAN, Verdict.UNATTESTED, Verdict.VERIFIED, Verdict.UNVERIFIED})
log = logging.getLogger("kvfence.gateway.audit")


def _count(metrics: Metrics, ctx: AuditContext, answer: Answer, judgement: Judgement) -> None:
    """The verdict, and the tokens the answer reported, per tenant and model."""
    metrics.child(metrics.verdicts, ctx.backend.name, judgement.verdict.value).inc()
    prompt, cached, total = answer.prompt_tokens, answer.cached_tokens, answer.total_tokens
    if prompt:
        metrics.child(metrics.prompt_tokens, ctx.tenant, ctx.model).inc(prompt)
    if cached:
        metrics.child(metrics.cached_tokens, ctx.tenant, ctx.model).inc(cached)
    if total and prompt is not None and total > prompt:
        metrics.child(metrics.completion_tokens, ctx.tenant, ctx.model).inc(total - prompt)


async def settle(
    request: web.Request,
    ctx: AuditContext,
    answer: Answer,
    judgement: Judgement,
    *,
    status: int | None = None,
    reason: str | None = None,
) -> web.Response | None:
    """Count, log and record the judgement. Returns the local answer that replaces a withheld
    response, else None. `status` and `reason` describe a failed exchange (the client got that
    status, or left: 499). Raises AuditWriteFailed when the record is lost."""
    assert not answer.settled, "an answer is settled once"
    answer.settled = True
    refusal = None
    if judgement.blocked:
        refusal = AttestationRefused(
            f"the response was withheld: its audit verdict is {judgement.verdict.value}"
        )
        status, reason = refusal.status, refusal.code
    final_status = answer.status if status is None else status
    traces = request.app.get(TRACES)
    if traces is not None:  # gateway.tracing: this attempt's span
        traces.record(request, ctx, answer, judgement, final_status, reason)
    if answer.total_tokens:
        request[USED_TOKENS] = answer.total_tokens
    _count(request.app[METRICS], ctx, answer, judgement)
    entry = record(ctx, answer, judgement, final_status, reason)
    if judgement.verdict not in _QUIET:
        log.warning("audit verdict", extra={"rid": ctx.request_id, **entry})
    settings = request[RUNTIME].policy.gateway.audit_log
    try:
        await request.app[AUDIT_SINK].append(settings, entry)
    except AuditWriteError as exc:
        request.app[METRICS].audit_failures.inc()
        log.error("audit write failed", extra={"rid": ctx.request_id, "error": str(exc)})
        raise AuditWriteFailed("the audit record could not be written") from None
    if judgement.verdict is Verdict.VIOLATION and ctx.verifier is None:
        kind = "marker" if answer.markers else "detective"
        await request.app[WATCH].violation(ctx.backend, kind)
    if refusal is None:
        return None
    return error_response(
        refusal, ctx.request_id, headers={VERDICT_HEADER: judgement.verdict.value}
    )
