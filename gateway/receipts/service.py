"""What a worker holds for receipts: the key set of the policy in force, the ledger in the
control-plane database (shared by every worker and replica) and its sweeper; `issue` completes
an answer's draft at the next index of its tenant's receipt log, signs it and stores it, and
whether receipts can be written now (`/readyz`).

Invariant: `issue` returns only once the receipt and its log entry are stored, so an id the
client holds can be fetched from any replica as soon as the answer is complete; one that cannot
be stored raises `ReceiptWriteError` (the answer fails closed, and its record says so), marks
receipts unwritable until a write succeeds again, and that return is recorded
(`receipts_resumed`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Final

from aiohttp import web

from gateway.audit.judge import Answer, AuditContext, Judgement
from gateway.audit.sink import AUDIT_SINK, log_signer
from gateway.control.engine import ControlRefused, ControlUnavailable
from gateway.control.receipts import ReceiptLedger
from gateway.control.store import ControlStore
from gateway.policy.model import Policy
from gateway.receipts.draft import Draft
from gateway.receipts.keys import KeysCache, ReceiptKeys
from gateway.receipts.store import HOUR, ReceiptWriteError, expiry_of
from kvfence.namespace import namespace_label
from kvfence.receipts.note import Signer
from kvfence.receipts.receipt import log_entry, sign

SWEEP_EVERY_S: Final = 600.0
RETRY_S: Final = 1.0  # how often /readyz tries a write while receipts cannot be written
log = logging.getLogger("kvfence.gateway.receipts")


def tenant_log(name: str, tenant: str) -> str:
    """A tenant's receipt log's origin: the log's name and a digest of the tenant id (its
    receipts name it; no other tenant's entry is ever in it)."""
    return f"{name}/tenant/{hashlib.sha256(tenant.encode()).hexdigest()[:16]}"


class Receipts:
    def __init__(self, control: ControlStore) -> None:
        self._keys = KeysCache()
        self.ledger = ReceiptLedger(control)
        self.failed: str | None = None  # why receipts cannot be written now
        self._retry_at = 0.0

    def keys(self, policy: Policy) -> ReceiptKeys | None:
        return self._keys.get(policy)

    def signer(self, policy: Policy) -> Signer | None:
        audit = policy.gateway.audit_log
        checkpoints = audit.checkpoints if audit is not None else None
        return None if checkpoints is None else log_signer(checkpoints)

    async def issue(
        self,
        app: web.Application,
        policy: Policy,
        draft: Draft,
        ctx: AuditContext,
        judgement: tuple[Answer, Judgement],
        status: int,
        reason: str | None,
    ) -> None:
        """Complete, sign and store the answer's receipt. Raises ReceiptWriteError."""
        keys = self.keys(policy)
        if keys is None:
            raise ReceiptWriteError("receipts need gateway.receipts and the witnessed audit log")
        answer, verdict = judgement
        origin = tenant_log(keys.checkpoints.name, ctx.tenant)
        entry = log_entry(draft.receipt_id, verdict.verdict.value, status,
                          namespace_label(ctx.namespace), keys.keyset)  # fmt: skip

        def complete(index: int, leaf: bytes) -> dict[str, Any]:
            doc = draft.document(ctx, answer, verdict, status, reason, (origin, index, leaf),
                                 keys.keyset)  # fmt: skip
            return sign(doc, keys.key_id, keys.key)

        expires = float((expiry_of(draft.receipt_id) or 0) * HOUR)
        try:
            await self.ledger.issue(origin, ctx.tenant, draft.receipt_id, expires, entry, complete)
        except (ControlUnavailable, ControlRefused) as exc:
            self.failed = self.failed or str(exc)
            raise ReceiptWriteError(str(exc)) from None
        if self.failed is not None:
            await self._resumed(app, policy)

    async def unwritable(self, app: web.Application, policy: Policy) -> str | None:
        """Why no receipt can be written now (tried again at most every RETRY_S), or None."""
        if self.failed is None or policy.gateway.receipts is None:
            return None
        now = time.monotonic()
        if now >= self._retry_at:
            self._retry_at = now + RETRY_S
            try:
                await self.ledger.probe()
            except (ControlUnavailable, ControlRefused) as exc:
                self.failed = str(exc)
                return self.failed
            await self._resumed(app, policy)
        return self.failed

    async def _resumed(self, app: web.Application, policy: Policy) -> None:
        after, self.failed = self.failed, None
        if after is None:
            return
        log.warning("receipts resumed", extra={"after": after})
        record = {"event": "receipts_resumed", "after": after, "time": round(time.time(), 3)}
        await app[AUDIT_SINK].event(policy.gateway.audit_log, record)

    async def sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY_S)
            try:
                removed = await self.ledger.sweep()
            except (ControlUnavailable, ControlRefused) as exc:
                log.error("expired receipts not swept", extra={"error": str(exc)})
                continue
            if removed:
                log.info("expired receipts removed", extra={"receipts": removed})


RECEIPTS = web.AppKey("kvfence_receipts", Receipts)


async def receipts_ctx(app: web.Application) -> AsyncIterator[None]:
    sweeper = asyncio.create_task(app[RECEIPTS].sweep())
    yield
    sweeper.cancel()
    await asyncio.gather(sweeper, return_exceptions=True)
