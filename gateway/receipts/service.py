"""What a worker holds for receipts: the key set of the policy in force, the open store (one per
configured folder, kept across reloads) and its sweeper; `issue` turns a settled exchange's
draft into the signed receipt and stores it.

Invariant: `issue` returns only once the receipt is stored, so an answer whose id the client
holds can be fetched as soon as the answer is complete; a receipt that cannot be stored raises
`ReceiptWriteError` (the answer fails closed).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
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

    async def issue(
        self,
        policy: Policy,
        draft: Draft,
        ctx: AuditContext,
        answer: Answer,
        judgement: Judgement,
        status: int,
        reason: str | None,
        appended: Appended,
    ) -> None:
        keys, store = self.keys(policy), self.store(policy)
        if keys is None or store is None or not appended.origin:
            raise ReceiptWriteError("receipts need the witnessed audit log (its checkpoints)")
        doc = draft.document(ctx, answer, judgement, status, reason, appended, keys.keyset)
        sign(doc, keys.key_id, keys.key)
        await store.put(draft.receipt_id, ctx.tenant, doc, appended.line)

    async def sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY_S)
            for store in list(self._stores.values()):
                removed = await asyncio.to_thread(store.sweep)
                if removed:
                    log.info("expired receipts removed", extra={"folders": removed})

    def close(self) -> None:
        for store in self._stores.values():
            store.close()
        self._stores.clear()


RECEIPTS = web.AppKey("kvfence_receipts", Receipts)


async def receipts_ctx(app: web.Application) -> AsyncIterator[None]:
    sweeper = asyncio.create_task(app[RECEIPTS].sweep())
    yield
    sweeper.cancel()
    await asyncio.gather(sweeper, return_exceptions=True)
    app[RECEIPTS].close()
