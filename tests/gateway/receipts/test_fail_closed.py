"""A full receipt store: answers fail closed, each answer's audit record says its receipt could
not be stored (and names none), `/readyz` is 503 while no receipt can be written; once one can,
a record marks their return and answers carry receipts again. A stream, whose head carried its
receipt id, ends with an error naming that id instead of `[DONE]`."""

from __future__ import annotations

import sqlite3

import orjson

from gateway.control.service import CONTROL
from gateway.control.sqlite import SqliteEngine
from tests.gateway.receipts.conftest import Stack
from tests.gateway.receipts.test_receipts import CHAT, ask
from tests.kit.polling import until
from tests.kit.receipts import Tenant


def records(stack: Stack) -> list[dict[str, object]]:
    lines = (stack.keys.folder / "log" / "audit.jsonl").read_bytes().splitlines()
    return [orjson.loads(line) for line in lines]


async def ready(stack: Stack) -> int:
    async with stack.gw.session.get(stack.gw.url + "/readyz") as resp:
        return resp.status


def engine_of(stack: Stack) -> SqliteEngine:
    engine = stack.gw.app[CONTROL].engine
    assert isinstance(engine, SqliteEngine)
    return engine


def full(db: sqlite3.Connection) -> None:
    """The database cannot grow by a page."""
    (pages,) = db.execute("PRAGMA page_count").fetchone()
    db.execute(f"PRAGMA max_page_count = {pages}")


def unfull(db: sqlite3.Connection) -> None:
    db.execute("PRAGMA max_page_count = 1073741823")


async def test_a_full_receipt_store_fails_closed_and_says_so(stack: Stack) -> None:
    engine = engine_of(stack)
    status, *_ = await ask(stack, "acme", CHAT)
    assert status == 200 and await ready(stack) == 200
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
    await engine.run(unfull)

    async def back() -> bool:
        return await ready(stack) == 200

    await until(back, what="/readyz 200 once receipts can be written")
    resumed = [r for r in records(stack) if r.get("event") == "receipts_resumed"]
    assert len(resumed) == 1 and "full" in str(resumed[0]["after"])
    status, request, response, receipt_id = await ask(stack, "acme", CHAT)
    assert status == 200 and receipt_id
    assert (await stack.tenant("acme").verify(receipt_id, request, response)).ok


REFUSE = """CREATE TEMP TRIGGER refuse BEFORE INSERT ON main.receipts
BEGIN SELECT RAISE(ABORT, 'receipts refused'); END"""  # every receipt, whatever its size


def last_event(body: bytes) -> bytes:
    return body.strip().rsplit(b"\n\n", 1)[-1]


async def not_served(tenant: Tenant, receipt_id: str) -> bool:
    status, body = await tenant.get(f"/v1/kvfence/receipts/{receipt_id}")
    return status == 404 and b"receipt_not_found" in body


async def test_a_stream_whose_receipt_is_lost_ends_saying_so(stack: Stack) -> None:
    """Its head already carried a receipt id: the stream ends with an error naming that id
    instead of `[DONE]`, its record names no receipt, and the id is not served."""
    engine, acme = engine_of(stack), stack.tenant("acme")
    await engine.run(lambda db: db.execute(REFUSE))
    for mode, early in [("ok", None), ("die_mid", "upstream_unavailable")]:
        stack.gw.upstream.mode = mode
        status, _, body, receipt_id = await ask(stack, "acme", {**CHAT, "stream": True})
        assert status == 200 and receipt_id and b"[DONE]" not in body
        event, data = last_event(body).split(b"\n")
        assert event == b"event: error" and data.startswith(b"data: ")
        error = orjson.loads(data.removeprefix(b"data: "))["error"]
        assert error["code"] == "receipt_unavailable" and error["type"] == "server_error"
        assert receipt_id in error["message"] and "could not be stored" in error["message"]
        assert (early in error["message"]) if early else "ended early" not in error["message"]
        final = [r for r in records(stack) if r.get("phase") == "final"][-1]
        assert final["receipt_id"] is None and final["reason"] == "receipt_write_failed"
        assert "receipts refused" in str(final["receipt_error"])
        assert final["status"] == (200 if early is None else 502)
        assert receipt_id.encode() not in (stack.keys.folder / "log" / "audit.jsonl").read_bytes()
        assert await not_served(acme, receipt_id)
    await engine.run(lambda db: db.execute("DROP TRIGGER temp.refuse"))
    stack.gw.upstream.mode = "ok"
    status, request, response, receipt_id = await ask(stack, "acme", {**CHAT, "stream": True})
    assert status == 200 and response.endswith(b"data: [DONE]\n\n")
    assert (await acme.verify(receipt_id, request, response)).ok
