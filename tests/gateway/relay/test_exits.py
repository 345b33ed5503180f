"""Every exit audited, nothing relayed unrecorded: a plain request whose client leaves gets its
499 record; a stream's record is open before its first byte and completed at its end; with the
audit disk full nothing is relayed, `/readyz` says so (and recovers with the disk) while
`/healthz` stays up; streams the client cuts before their usage are charged against
tokens_per_min."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.audit.chain.chainfile import ChainFile
from gateway.audit.chain.format import mac_key
from gateway.audit.chain.verify import unfinished, verify_chain
from gateway.policy.load import parse_policy
from tests.fakes.openai_upstream import LONG, FakeUpstream
from tests.kit.gateway import ENV, KEYS, Gateway, policy_text, run_gateway
from tests.kit.polling import until

AUDIT_KEY = "audit-key-0123456789abcdef"
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}


@contextlib.asynccontextmanager
async def audited(mode: str, log: Path, tenant_limits: str = "") -> AsyncIterator[Gateway]:
    upstream = FakeUpstream(mode=mode)
    await upstream.start()
    text = policy_text(upstream.url).replace(
        "access_log: false", f"access_log: false\n  audit_log: {{path: {log}, key: {{env: AUDIT}}}}"
    )
    if tenant_limits:
        text = text.replace("id: acme, ", f"id: acme, limits: {{{tenant_limits}}}, ")
    gw, runner = await run_gateway(
        parse_policy(text, "p", env={**ENV, "AUDIT": AUDIT_KEY}), upstream
    )
    try:
        yield gw
    finally:
        await gw.session.close()
        await runner.cleanup()
        await upstream.close()


def records(log: Path) -> list[dict[str, Any]]:
    rows = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    return [r for r in rows if r.get("kind") == "record"]


async def test_a_plain_request_whose_client_leaves_is_audited_499(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    async with audited("stall_before", log) as gw:
        ids = [f"leaves-{i}" for i in range(5)]
        for rid in ids:
            seen = len(gw.upstream.received)
            task = asyncio.create_task(gw.chat("acme", CHAT, **{"x-request-id": rid}))
            await until(lambda seen=seen: len(gw.upstream.received) > seen, what="the upstream")
            task.cancel()  # the client leaves while the backend works on its answer
            with contextlib.suppress(asyncio.CancelledError):
                await task
        logged = await until(lambda: len(records(log)) == 5 and records(log), what="5 records")
    assert [(r["request_id"], r["status"], r["reason"]) for r in logged] == [
        (rid, 499, "client_closed") for rid in ids
    ]


async def test_a_streams_record_is_open_before_its_first_byte_and_completed_at_its_end(
    tmp_path: Path,
) -> None:
    log = tmp_path / "audit.jsonl"
    async with audited("hold", log) as gw:  # one event, then the backend holds the stream
        resp = await gw.chat("acme", {**CHAT, "stream": True})
        assert (await resp.content.readline()).startswith(b"data: {")
        [opened] = records(log)  # written before that byte was sent
        assert (opened["phase"], opened["status"], opened["verdict"]) == ("open", 200, "unverified")
        assert unfinished(verify_chain(log, mac_key(AUDIT_KEY.encode()))) == 1
        resp.close()  # the client leaves: the record is completed
        await until(lambda: len(records(log)) == 2, what="the final record")
    opened, final = records(log)
    assert final["phase"] == "final" and final["upstream_id"] == opened["upstream_id"]
    assert (final["status"], final["reason"]) == (499, "client_closed")
    assert unfinished(verify_chain(log, mac_key(AUDIT_KEY.encode()))) == 0


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """The audit log's disk, full while `state["full"]` (every write fails with ENOSPC)."""
    state = {"full": False}
    write = ChainFile.write

    def failing(self: ChainFile, entry: dict[str, Any]) -> None:
        if state["full"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        write(self, entry)

    monkeypatch.setattr(ChainFile, "write", failing)
    return state


async def test_with_the_audit_disk_full_nothing_is_relayed_and_readyz_says_so(
    tmp_path: Path, full_disk: dict[str, bool]
) -> None:
    log = tmp_path / "audit.jsonl"
    async with audited("ok", log) as gw:
        assert (await gw.session.get(gw.url + "/readyz")).status == 200
        full_disk["full"] = True
        for body in ({**CHAT, "stream": True}, CHAT):
            resp = await gw.chat("acme", body)
            assert resp.status == 502, await resp.text()
            assert (await resp.json())["error"]["code"] == "audit_write_failed"  # no token
        ready = await gw.session.get(gw.url + "/readyz")
        assert ready.status == 503 and "no audit record" in (await ready.json())["error"]["message"]
        assert (await gw.session.get(gw.url + "/healthz")).status == 200
        full_disk["full"] = False

        async def ready_again() -> bool:
            return (await gw.session.get(gw.url + "/readyz")).status == 200

        await until(ready_again, 10, "ready once records can be written")
        resp = await gw.chat("acme", {**CHAT, "stream": True})
        assert resp.status == 200 and b"[DONE]" in await resp.read()
    rows = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    assert [r.get("event") for r in rows if r.get("event")] == ["audit_resumed"]
    assert verify_chain(log, mac_key(AUDIT_KEY.encode()))


async def test_streams_cut_before_their_usage_are_charged_against_tokens_per_min(
    tmp_path: Path,
) -> None:
    async with audited("long", tmp_path / "audit.jsonl", "tokens_per_min: 400") as gw:
        admitted, refused = 0, []
        for _ in range(12):
            resp = await gw.chat("acme", {**CHAT, "stream": True})
            if resp.status != 200:
                refused.append((resp.status, (await resp.json())["error"]["message"]))
                continue
            admitted += 1
            events = 0
            async for line in resp.content:
                events += line.startswith(b"data: {")
                if events == LONG * 5 // 8:  # cut before the usage chunk
                    break
            resp.close()
    # Each cut stream is charged at least the 40 events its client read, plus its prompt.
    assert admitted <= 7 and len(refused) == 12 - admitted
    assert all(s == 429 and "tokens per min" in m for s, m in refused)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_half_closed_client_gets_a_clean_close_that_is_audited(
    tmp_path: Path, stream: bool
) -> None:
    """A client that shuts its sending side is taken as gone (as nginx and Go's server take
    it): its request is cancelled upstream, its connection closed cleanly (no reset), and the
    request recorded 499."""
    log = tmp_path / "audit.jsonl"
    async with audited("hold" if stream else "stall_before", log) as gw:
        host, port = gw.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        body = orjson.dumps({**CHAT, "stream": stream})
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + KEYS["acme"].encode() + b"\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        await until(lambda: gw.upstream.received, what="the request upstream")
        if stream:
            await reader.readuntil(b"data: ")  # its answer has begun
        writer.write_eof()
        async with asyncio.timeout(10):
            while await reader.read(65536):  # what was sent before, then a clean end
                pass
        writer.close()
        await until(lambda: [r for r in records(log) if r["phase"] == "final"], what="a record")
    final = [r for r in records(log) if r["phase"] == "final"]
    assert [(r["status"], r["reason"]) for r in final] == [(499, "client_closed")]


async def test_a_client_that_resets_a_stream_is_recorded_499_and_logs_no_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that resets its connection mid-stream (RST, as a killed process or a load
    balancer's timeout does) is a normal exit, not a server error: the gateway's next write
    fails, the record says 499 client_closed, and nothing is logged at ERROR."""
    caplog.set_level(logging.INFO)
    log = tmp_path / "audit.jsonl"
    rounds = 6
    async with audited("flood", log) as gw:  # big events keep coming after the client has gone
        host, port = gw.url.removeprefix("http://").split(":")
        body = orjson.dumps({**CHAT, "stream": True})
        for _ in range(rounds):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nAuthorization: Bearer "
                + KEYS["acme"].encode()
                + b"\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )
            await reader.readuntil(b"data: ")  # its answer has begun
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()  # closed with a reset, its receive buffer unread
        finals = await until(
            lambda: (
                len([r for r in records(log) if r["phase"] == "final"]) == rounds
                and [r for r in records(log) if r["phase"] == "final"]
            ),
            what=f"{rounds} final records",
        )
        served = await gw.chat("acme", CHAT)  # the gateway serves on
        assert served.status == 200
    assert [(r["status"], r["reason"]) for r in finals] == [(499, "client_closed")] * rounds
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
