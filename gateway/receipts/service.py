"""What a worker holds for receipts: the key set of the policy in force, the store (one per
configured folder, kept across reloads) and its sweeper; `writer` gives settle what the audit
log's writer thread runs once the answer's record is written: the draft completed with the
record's position, signed and stored, with no hand-off of its own.

Invariant: the record's append returns only once its receipt is stored, so an answer whose id
the client holds can be fetched as soon as the answer is complete; a receipt that cannot be
stored raises `ReceiptWriteError` there (the answer fails closed).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Final

from aiohttp import web

from gateway.audit.chain.log import Appended
from gateway.audit.judge import Answer, AuditContext, Judgement
from gateway.policy.model import Policy
from gateway.receipts.draft import Draft
from gateway.receipts.keys import KeysCache, ReceiptKeys
from gateway.receipts.store import ReceiptStore, ReceiptWriteError
from kvfence.receipt import sign

SWEEP_EVERY_S: Final = 600.0
log = logging.getLogger("kvfence.gateway.receipts")


class Receipts:
    def __init__(self) -> None:
        self._keys = KeysCache()
        self._stores: dict[Path, ReceiptStore] = {}

    def keys(self, policy: Policy) -> ReceiptKeys | None:
        return self._keys.get(policy)

    def store(self, policy: Policy) -> ReceiptStore | None:
        settings = policy.gateway.receipts
        if settings is None:
            return None
        store = self._stores.get(settings.path)
        if store is None:
            store = self._stores[settings.path] = ReceiptStore(settings.path)
        return store

    def writer(
        self,
        policy: Policy,
        draft: Draft,
        ctx: AuditContext,
        answer: Answer,
        judgement: Judgement,
        status: int,
        reason: str | None,
    ) -> Callable[[Appended], None]:
        """What completes, signs and stores the receipt once its record is written (run on the
        audit writer thread, while the exchange awaits the append)."""
        keys, store = self.keys(policy), self.store(policy)
        if keys is None or store is None:
            raise ReceiptWriteError("receipts need gateway.receipts and the witnessed audit log")

        def write(appended: Appended) -> None:
            if not appended.origin:
                raise ReceiptWriteError("receipts need the witnessed audit log (its checkpoints)")
            doc = draft.document(ctx, answer, judgement, status, reason, appended, keys.keyset)
            sign(doc, keys.key_id, keys.key)
            store.write(draft.receipt_id, ctx.tenant, doc, appended.line)

        return write

    async def sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY_S)
            for store in list(self._stores.values()):
                removed = await asyncio.to_thread(store.sweep)
                if removed:
                    log.info("expired receipts removed", extra={"folders": removed})

    def close(self) -> None:
        self._stores.clear()


RECEIPTS = web.AppKey("kvfence_receipts", Receipts)


async def receipts_ctx(app: web.Application) -> AsyncIterator[None]:
    sweeper = asyncio.create_task(app[RECEIPTS].sweep())
    yield
    sweeper.cancel()
    await asyncio.gather(sweeper, return_exceptions=True)
    app[RECEIPTS].close()
