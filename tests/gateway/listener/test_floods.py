"""Connection floods: clients that trickle their headers and reconnect whenever they are cut do
not lock a normal client out, and a burst of simultaneous connections beyond the cap is answered,
never silently closed."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from gateway.policy.load import parse_policy
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, KEYS, policy_text, run_gateway

LIMITS = "max_body_bytes: 65536, max_connections: 48, header_timeout_s: 3"


async def trickler(host: str, port: int, stop: asyncio.Event) -> None:
    """Open, send a header byte now and then, reconnect when cut: forever, until `stop`."""
    while not stop.is_set():
        with contextlib.suppress(OSError, ConnectionError):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            while not stop.is_set() and not reader.at_eof():
                writer.write(b"X")
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader.read(1024), 0.3)
            writer.close()
        await asyncio.sleep(0)


async def test_a_normal_client_is_served_through_a_reconnecting_flood(
    upstream: FakeUpstream,
) -> None:
    text = policy_text(upstream.url).replace("max_body_bytes: 65536", LIMITS)
    text = text.replace("header_timeout_s: 0.5, ", "")
    gw, runner = await run_gateway(parse_policy(text, "p", env=ENV), upstream)
    host, port = gw.url.removeprefix("http://").split(":")
    stop = asyncio.Event()
    flood = [asyncio.create_task(trickler(host, int(port), stop)) for _ in range(150)]
    served = 0
    try:
        await asyncio.sleep(1.0)  # the flood holds every connection slot by now
        connector = aiohttp.TCPConnector(force_close=True)  # a fresh connection each time
        async with aiohttp.ClientSession(connector=connector) as normal:
            for _ in range(30):
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with normal.post(
                        gw.url + "/v1/chat/completions",
                        json={"model": "smollm2", "messages": []},
                        headers={"authorization": f"Bearer {KEYS['acme']}"},
                        timeout=aiohttp.ClientTimeout(total=5),
                    ) as resp:
                        served += resp.status == 200
        assert served >= 27, f"{served} of 30 served during the flood"
    finally:
        stop.set()
        await asyncio.gather(*flood, return_exceptions=True)
        await gw.session.close()
        await runner.cleanup()


async def test_a_burst_beyond_the_cap_is_answered_not_dropped() -> None:
    upstream = FakeUpstream(mode="hold")
    await upstream.start()
    text = policy_text(upstream.url).replace("max_body_bytes: 65536", LIMITS)
    text = text.replace("header_timeout_s: 0.5, ", "")
    gw, runner = await run_gateway(parse_policy(text, "p", env=ENV), upstream)
    host, port = gw.url.removeprefix("http://").split(":")
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer "
        + KEYS["acme"].encode()
        + b'\r\nContent-Length: 46\r\n\r\n{"model": "smollm2", "messages": [], "stream": true}'[:46]
    )

    async def one() -> bytes:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(request)
        try:
            async with asyncio.timeout(10):
                return await reader.readuntil(b"\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return b""  # closed without an answer
        finally:
            writer.close()

    try:
        lines = await asyncio.gather(*(one() for _ in range(120)))
        assert all(line.startswith(b"HTTP/1.1 ") for line in lines), lines.count(b"")
        assert sum(line.startswith(b"HTTP/1.1 503") for line in lines) > 0
    finally:
        await gw.session.close()
        await runner.cleanup()
        await upstream.close()
