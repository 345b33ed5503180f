"""Slow and greedy clients are cut, not held."""

import asyncio

from gateway.listener.connections import GRACE_TICKS, PRESSURE
from gateway.policy.load import parse_policy
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, KEYS, Gateway, policy_text, run_gateway
from tests.kit.polling import until


async def _connect(gw: Gateway) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = gw.url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def test_trickling_headers_are_cut(gw: Gateway) -> None:
    reader, writer = await _connect(gw)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    await writer.drain()
    # Keep sending a header byte at a time; the header deadline (0.5 s) still closes us.
    closed = False
    async with asyncio.timeout(10):
        while not closed:
            try:
                writer.write(b"X")
                await writer.drain()
                closed = await asyncio.wait_for(reader.read(1024), 0.1) == b""
            except TimeoutError:
                continue
            except ConnectionError:
                closed = True
    assert closed
    writer.close()


async def test_idle_connection_is_cut(gw: Gateway) -> None:
    reader, writer = await _connect(gw)
    async with asyncio.timeout(10):
        assert await reader.read(1024) == b""
    writer.close()


async def test_trickling_body_is_408(gw: Gateway) -> None:
    reader, writer = await _connect(gw)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
        b"Authorization: Bearer " + KEYS["acme"].encode() + b"\r\n\r\n{"
    )
    await writer.drain()
    async with asyncio.timeout(10):
        head = await reader.readuntil(b"\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    writer.close()


async def test_body_over_limit_is_413(gw: Gateway) -> None:
    big = {"model": "smollm2", "messages": [{"role": "user", "content": "x" * 70000}]}
    resp = await gw.chat("acme", big)
    assert resp.status == 413
    assert gw.upstream.received == []


def _capped(url: str) -> str:
    return (
        policy_text(url)
        .replace(
            "max_body_bytes: 65536",
            "max_body_bytes: 65536, max_connections: 2, header_timeout_s: 30",
        )
        .replace("header_timeout_s: 0.5, ", "")
    )


async def test_at_the_cap_a_request_takes_the_place_of_the_longest_idle_connection(
    upstream: FakeUpstream,
) -> None:
    gw, runner = await run_gateway(parse_policy(_capped(upstream.url), "t.yaml", env=ENV), upstream)
    pressure = gw.app[PRESSURE]
    try:
        (r1, w1), (r2, w2) = await _connect(gw), await _connect(gw)
        r3, w3 = await _connect(gw)  # over the cap: held, and nobody is closed for it yet
        await until(lambda: pressure.held == 1, 5, "the newcomer held")
        grown = pressure.tick + GRACE_TICKS
        await until(lambda: pressure.tick > grown, 10, "the idle ones past their grace")
        assert not r1.at_eof() and not r2.at_eof()
        w3.write(_chat("acme"))  # its request arrives: the oldest idle connection gives way
        async with asyncio.timeout(10):
            assert (await r3.readuntil(b"\r\n")).startswith(b"HTTP/1.1 200")
            assert await r1.read(1024) == b""
        assert not r2.at_eof()
        for w in (w1, w2, w3):
            w.close()
    finally:
        await gw.session.close()
        await runner.cleanup()


async def test_when_every_connection_is_busy_a_request_gets_503_and_a_probe_200() -> None:
    upstream = FakeUpstream(mode="hold")
    await upstream.start()
    gw, runner = await run_gateway(parse_policy(_capped(upstream.url), "t.yaml", env=ENV), upstream)
    body = {"model": "smollm2", "messages": [], "stream": True}
    try:
        busy = [await gw.chat(t, body) for t in ("acme", "globex")]  # both held open upstream
        reader, writer = await _connect(gw)
        writer.write(_chat("acme"))
        async with asyncio.timeout(10):
            answer = await reader.read()
        head = answer.lower()
        assert head.startswith(b"http/1.1 503") and b"retry-after: 1" in head
        assert b"connection: close" in head and b'"code":"overloaded"' in head
        writer.close()
        reader, writer = await _connect(gw)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(10):
            assert (await reader.readuntil(b"\r\n")).startswith(b"HTTP/1.1 200")
        for resp in busy:
            resp.close()
        writer.close()
    finally:
        await gw.session.close()
        await runner.cleanup()
        await upstream.close()


def _chat(tenant: str) -> bytes:
    body = b'{"model":"smollm2","messages":[]}'
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + KEYS[tenant].encode() + b"\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
