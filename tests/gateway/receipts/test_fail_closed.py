"""A full receipt store: answers fail closed, each answer's audit record says its receipt could
not be stored (and names none), `/readyz` is 503 while no receipt can be written; once one can,
a record marks their return and answers carry receipts again."""

from __future__ import annotations

import sqlite3

import orjson

from gateway.control.service import CONTROL
from gateway.control.sqlite import SqliteEngine
from tests.gateway.receipts.conftest import Stack
from tests.gateway.receipts.test_receipts import CHAT, ask
from tests.kit.polling import until


def records(stack: Stack) -> list[dict[str, object]]:
    lines = (stack.keys.folder / "log" / "audit.jsonl").read_bytes().splitlines()
    return [orjson.loads(line) for line in lines]


async def ready(stack: Stack) -> int:
    async with stack.gw.session.get(stack.gw.url + "/readyz") as resp:
        return resp.status


async def test_a_full_receipt_store_fails_closed_and_says_so(stack: Stack) -> None:
    engine = stack.gw.app[CONTROL].engine
    assert isinstance(engine, SqliteEngine)
    status, *_ = await ask(stack, "acme", CHAT)
    assert status == 200 and await ready(stack) == 200

    def full(db: sqlite3.Connection) -> None:  # the database cannot grow by a page
        (pages,) = db.execute("PRAGMA page_count").fetchone()
        db.execute(f"PRAGMA max_page_count = {pages}")

    await engine.run(full)
    lost = [await ask(stack, "acme", {**CHAT, "stream": i % 2 == 1}) for i in range(6)]
    plain = [answer for i, answer in enumerate(lost) if i % 2 == 0]
    assert {status for status, *_ in plain} == {502}
    assert all(b"receipt_id" not in r and not rid for _, _, r, rid in plain)
    streamed = [answer for i, answer in enumerate(lost) if i % 2 == 1]
    assert all(b"event: error" in body and b"[DONE]" not in body for _, _, body, _ in streamed)
    finals = [r for r in records(stack) if r.get("phase") == "final"][-6:]
    assert all(r["receipt_id"] is None and r["reason"] == "receipt_write_failed" for r in finals)
    assert all("full" in str(r["receipt_error"]) for r in finals)
    assert [r["status"] for r in finals][::2] == [502, 502, 502]
    assert await ready(stack) == 503
    await engine.run(lambda db: db.execute("PRAGMA max_page_count = 1073741823"))

    async def back() -> bool:
        return await ready(stack) == 200

    await until(back, what="/readyz 200 once receipts can be written")
    resumed = [r for r in records(stack) if r.get("event") == "receipts_resumed"]
    assert len(resumed) == 1 and "full" in str(resumed[0]["after"])
    status, request, response, receipt_id = await ask(stack, "acme", CHAT)
    assert status == 200 and receipt_id
    assert (await stack.tenant("acme").verify(receipt_id, request, response)).ok
