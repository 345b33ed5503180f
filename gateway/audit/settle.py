"""Settle: the one place a judgement becomes what the client gets, its final audit record and
(for a tenant with receipts) the answer's signed receipt: the verdict is counted, logged when it
is not clean, traced (with `gateway.tracing`), and written to the audit log, which names the
receipt stored just before it (or says why none could be); a violation is reported to the
watch (a live marker quarantines; a detective finding triggers a canary round shaped like the
request); a withheld answer is replaced by a local error. Before a stream's first byte,
`open_stream` writes the record that settling it completes. Only the exchange calls either,
through its `Books`.

Invariant: every request that reached the upstream step is settled exactly once; a stream's
record is opened before a byte of it reaches the client; a record or a receipt that cannot be
written raises `AuditWriteFailed`, so the answer fails closed (a stream before its first byte; a
stream whose head named a receipt that could not be stored with `ReceiptUnavailable`, which names
it); a record never names a receipt that was not stored.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Final, NoReturn

from aiohttp import web

from gateway.audit.chain.log import Appended, AuditWriteError
from gateway.audit.judge import Answer, AuditContext, Judgement, record
from gateway.audit.replies import Withheld, unstored, withheld
from gateway.audit.sink import AUDIT_SINK
from gateway.audit.trace import TRACES
from gateway.errors import AuditWriteFailed, ReceiptUnavailable, error_body
from gateway.fleet.budgeter import BUDGETS
from gateway.metrics import METRICS, Metrics
from gateway.policy.model import Policy
from gateway.receipts.draft import Draft
from gateway.receipts.service import RECEIPTS
from gateway.receipts.store import ReceiptWriteError
from gateway.state import BODY, RECEIPT_ID, RESERVATION, RUNTIME, STREAM_OPEN, USED_TOKENS
from gateway.verify.evidence import canary_reason
from gateway.verify.shapes import of_request
from gateway.verify.watch import WATCH
from kvfence.verdict import Verdict

_QUIET: Final = frozenset({Verdict.CLEAN, Verdict.UNATTESTED, Verdict.VERIFIED, Verdict.UNVERIFIED})
log = logging.getLogger("kvfence.gateway.audit")


def _count(metrics: Metrics, ctx: AuditContext, answer: Answer, judgement: Judgement) -> None:
    """The verdict, and the tokens the answer reported, per tenant and model."""
    metrics.child(metrics.verdicts, ctx.backend.name, judgement.verdict.value).inc()
    why = _why(ctx, answer, judgement.verdict)
    if why:
        metrics.child(metrics.verdict_reasons, ctx.backend.name, judgement.verdict.value, why).inc()
    prompt, cached, total = answer.prompt_tokens, answer.cached_tokens, answer.total_tokens
    if prompt:
        metrics.child(metrics.prompt_tokens, ctx.tenant, ctx.model).inc(prompt)
    if cached:
        metrics.child(metrics.cached_tokens, ctx.tenant, ctx.model).inc(cached)
    if total and prompt is not None and total > prompt:
        metrics.child(metrics.completion_tokens, ctx.tenant, ctx.model).inc(total - prompt)


@dataclass(frozen=True, slots=True)
class Books:
    """Where one exchange settles: its request (the app's log, budgets, metrics and watch), its
    audit context and its receipt (None: this tenant gets none)."""

    request: web.Request
    ctx: AuditContext
    receipt: Draft | None

    async def open(self, answer: Answer, judgement: Judgement) -> None:
        await open_stream(self, answer, judgement)

    async def settle(
        self, answer: Answer, judgement: Judgement, status: int | None, reason: str | None
    ) -> Withheld | None:
        return await settle(self, answer, judgement, status=status, reason=reason)


async def settle(
    books: Books,
    answer: Answer,
    judgement: Judgement,
    *,
    status: int | None = None,
    reason: str | None = None,
) -> Withheld | None:
    """Count, log and record the judgement, and issue the answer's receipt. Returns the local
    answer that replaces a withheld response, else None. `status` and `reason` describe a
    failed exchange (the client got that status, or left: 499). Raises AuditWriteFailed when
    the record or the receipt is lost (ReceiptUnavailable: a stream's head named the receipt)."""
    assert not answer.settled, "an answer is settled once"
    answer.settled = True
    request, ctx, receipt = books.request, books.ctx, books.receipt
    local = None
    if judgement.blocked:
        local = withheld(judgement, ctx.request_id, receipt)
        status, reason = local.error.status, local.error.code
        if receipt is not None:
            receipt.replace(error_body(local.error))
    final_status = answer.status if status is None else status
    traces = request.app.get(TRACES)
    if traces is not None:  # gateway.tracing: this attempt's span
        traces.record(request, ctx, answer, judgement, final_status, reason)
    if answer.total_tokens or answer.estimated_tokens:
        request[USED_TOKENS] = answer.total_tokens or answer.estimated_tokens
    if final_status < 400 and RESERVATION in request:  # never retried: charged before its end
        reservation = request.pop(RESERVATION)
        await asyncio.shield(request.app[BUDGETS].settle(reservation, request.get(USED_TOKENS, 0)))
    _count(request.app[METRICS], ctx, answer, judgement)
    policy = request[RUNTIME].policy
    lost = None
    if receipt is not None:
        lost = await _issue(
            request, policy, receipt, ctx, (answer, judgement), final_status, reason
        )
    entry = record(ctx, answer, judgement, final_status, reason)
    instead = None
    if receipt is not None:
        instead = _name_receipt(request, entry, receipt, lost)
    if judgement.verdict not in _QUIET:
        log.warning("audit verdict", extra={"rid": ctx.request_id, **entry})
    await _write(request, ctx, entry, instead=instead)  # the lost receipt is what a client hears
    if lost is not None:
        _lost(request, ctx, lost, instead)
    if receipt is not None:
        request[RECEIPT_ID] = receipt.receipt_id
    if ctx.verifier is None and ctx.backend.verify is not None:
        await _report(request, ctx, answer)
    return local


async def _issue(
    request: web.Request,
    policy: Policy,
    receipt: Draft,
    ctx: AuditContext,
    judged: tuple[Answer, Judgement],
    status: int,
    reason: str | None,
) -> ReceiptWriteError | None:
    """Store the answer's receipt before its record is written (the record then names only a
    receipt that exists); why it could not be, or None."""
    try:
        await asyncio.shield(
            request.app[RECEIPTS].issue(request.app, policy, receipt, ctx, judged, status, reason)
        )
    except ReceiptWriteError as exc:
        return exc
    return None


def _name_receipt(
    request: web.Request, entry: dict[str, Any], receipt: Draft, lost: ReceiptWriteError | None
) -> ReceiptUnavailable | None:
    """`entry` names the stored receipt, or says why there is none and what the client got
    instead; returns the error that ends a stream whose head named the receipt that was lost."""
    if lost is None:
        entry["receipt_id"] = receipt.receipt_id
        return None
    reason = entry["reason"]
    entry.update(receipt_id=None, receipt_error=str(lost), reason="receipt_write_failed")
    if request.get(STREAM_OPEN, False):  # 200 went out: it ends with an error event instead
        return unstored(receipt.receipt_id, reason)
    if entry["status"] < 400:
        entry["status"] = AuditWriteFailed.status
    return None


def _why(ctx: AuditContext, answer: Answer, verdict: Verdict) -> str:
    """Why an external server's answer is unverified or unexplained (docs/verify.md)."""
    if verdict is Verdict.UNEXPLAINED and answer.finding is not None:
        return answer.finding.reason
    if verdict is Verdict.UNVERIFIED:
        return canary_reason(ctx.backend, ctx.health, ctx.now)
    return ""


async def _report(request: web.Request, ctx: AuditContext, answer: Answer) -> None:
    """A live marker quarantines the backend; a hit its own namespace does not explain
    triggers a canary round shaped like this request."""
    watch = request.app[WATCH]
    if answer.markers:
        await watch.marker(ctx.backend)
    elif answer.finding is not None and answer.finding.verdict is not None:
        shape = of_request(request.path, request[BODY], answer.prompt_tokens)
        await watch.finding(ctx.backend, ctx.tenant, shape, answer.finding)


async def open_stream(books: Books, answer: Answer, judgement: Judgement) -> None:
    """A stream's record, written before its first byte (`phase: open`, the verdict at its
    head); settling the stream writes its final one, whose sync (`fsync: always`) covers this
    one too: the first byte waits for the write, not for a sync. Raises AuditWriteFailed when
    it cannot be written: the stream is then refused before any token."""
    entry = record(books.ctx, answer, judgement, answer.status, None, "open")
    await _write(books.request, books.ctx, entry, written=True)
    books.request[STREAM_OPEN] = True


async def _write(
    request: web.Request,
    ctx: AuditContext,
    entry: dict[str, Any],
    *,
    written: bool = False,
    instead: AuditWriteFailed | None = None,
) -> Appended | None:
    """Append `entry`; raises AuditWriteFailed (or `instead`) when it is lost."""
    settings = request[RUNTIME].policy.gateway.audit_log
    try:
        return await request.app[AUDIT_SINK].append(settings, entry, written=written)
    except AuditWriteError as exc:
        _lost(request, ctx, exc, instead)


def _lost(
    request: web.Request, ctx: AuditContext, exc: Exception, instead: AuditWriteFailed | None = None
) -> NoReturn:
    """Log and count a lost record or receipt, and fail the answer with `instead` (a stream
    whose receipt is lost) or AuditWriteFailed."""
    request.app[METRICS].audit_failures.inc()
    receipt_lost = isinstance(exc, ReceiptWriteError)
    event = "receipt write failed" if receipt_lost else "audit write failed"
    log.error(event, extra={"rid": ctx.request_id, "error": str(exc)})
    lost = "the answer's receipt" if receipt_lost else "the audit record"
    raise instead or AuditWriteFailed(f"{lost} could not be written") from None
