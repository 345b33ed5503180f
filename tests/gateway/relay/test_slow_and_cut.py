"""Answers that cannot be held whole or sent: a streaming client that stops reading is cut and
its upstream request cancelled and audited; a plain answer over the cap is refused; a stream the
upstream ends without `[DONE]` is a failure with an error event; after a cut stream the
client's connection stays usable."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from gateway.policy.load import parse_policy
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, KEYS, policy_text, run_gateway
from tests.kit.polling import until

AUDIT_KEY = "audit-key-0123456789abcdef"


def policy(url: str, log: Path, limits: str) -> str:
    text = policy_text(url).replace("max_body_bytes: 65536", f"max_body_bytes: 65536, {limits}")
    return text.replace(
        "access_log: false",
        f"access_log: false\n  audit_log: {{path: {log}, key: {{env: AUDIT}}}}",
    )


@pytest.fixture
async def flood() -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream(mode="flood")
    await fake.start()
    yield fake
    await fake.close()


def records(log: Path) -> list[dict[str, object]]:
    rows = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    return [r for r in rows if r.get("kind") == "record" and r.get("phase") != "open"]


async def test_a_client_that_stops_reading_is_cut_and_audited(
    flood: FakeUpstream, tmp_path: Path
) -> None:
    log = tmp_path / "audit.jsonl"
    text = policy(flood.url, log, "write_timeout_s: 0.5")
    gw, runner = await run_gateway(parse_policy(text, "p", env={**ENV, "AUDIT": AUDIT_KEY}), flood)
    host, port = gw.url.removeprefix("http://").split(":")
    _reader, writer = await asyncio.open_connection(host, int(port))
    body = orjson.dumps(
        {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    )
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + KEYS["acme"].encode() + b"\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    await writer.drain()  # ...and never read a byte
    try:
        await until(flood.cancelled.is_set, timeout_s=20, what="the upstream request cancelled")
        [record] = await until(lambda: records(log), what="the audit record")
        assert (record["status"], record["reason"]) == (499, "client_stalled")
    finally:
        writer.close()
        await gw.session.close()
        await runner.cleanup()


async def test_a_plain_answer_over_the_cap_is_refused(tmp_path: Path) -> None:
    fake = FakeUpstream(mode="huge")
    await fake.start()
    log = tmp_path / "audit.jsonl"
    text = policy(fake.url, log, "max_answer_bytes: 1048576")
    gw, runner = await run_gateway(parse_policy(text, "p", env={**ENV, "AUDIT": AUDIT_KEY}), fake)
    try:
        resp = await gw.chat("acme", {"model": "smollm2", "messages": []})
        assert resp.status == 502
        assert (await resp.json())["error"]["code"] == "answer_too_large"
        [record] = records(log)
        assert (record["status"], record["reason"]) == (502, "answer_too_large")
    finally:
        await gw.session.close()
        await runner.cleanup()
        await fake.close()


async def test_a_stream_without_done_fails_and_the_connection_stays_usable(
    tmp_path: Path,
) -> None:
    fake = FakeUpstream(mode="no_done")
    await fake.start()
    log = tmp_path / "audit.jsonl"
    text = policy(fake.url, log, "write_timeout_s: 5")
    gw, runner = await run_gateway(parse_policy(text, "p", env={**ENV, "AUDIT": AUDIT_KEY}), fake)
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))

    async def ask(stream: bool) -> bytes:
        body = orjson.dumps({"model": "smollm2", "messages": [], "stream": stream})
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Authorization: Bearer " + KEYS["acme"].encode() + b"\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        head = await reader.readuntil(b"\r\n\r\n")
        if b"chunked" in head.lower():
            return head + await reader.readuntil(b"\r\n0\r\n\r\n")  # the body's end
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        return head + await reader.readexactly(length)

    try:
        async with asyncio.timeout(20):
            cut = await ask(stream=True)
            assert cut.startswith(b"HTTP/1.1 200") and b"event: error" in cut
            assert b"[DONE]" not in cut and b"connection: close" not in cut.lower()
            again = await ask(stream=False)  # the same connection serves the next request
            assert again.startswith(b"HTTP/1.1 200")
        assert [r["status"] for r in records(log)] == [502, 200]
    finally:
        writer.close()
        await gw.session.close()
        await runner.cleanup()
        await fake.close()
