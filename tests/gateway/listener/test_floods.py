"""Connection floods: clients that trickle their headers and reconnect whenever they are cut never
push out a normal client's request (every client here shares 127.0.0.1, so nothing but the
requests themselves tells them apart); a burst beyond the cap is answered, never silently closed;
probes are answered through it all; a tenant's key, not its address, is what a cap counts."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp
import pytest

from gateway.listener.connections import GRACE_TICKS, PRESSURE
from gateway.policy.load import parse_policy
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, KEYS, Gateway, policy_text, run_gateway
from tests.kit.polling import until

LIMITS = "max_body_bytes: 65536, max_connections: 48, header_timeout_s: 3"


@contextlib.asynccontextmanager
async def capped(
    upstream: FakeUpstream, limits: str = LIMITS, keep: list[asyncio.StreamWriter] | None = None
) -> AsyncIterator[Gateway]:
    """A gateway with `limits`; the connections in `keep` are closed before it stops, so that
    it need not wait out the streams they hold."""
    text = policy_text(upstream.url)  # its streams held open stay open (deadlines of a minute)
    text = text.replace("max_body_bytes: 65536", limits).replace("header_timeout_s: 0.5, ", "")
    gw, runner = await run_gateway(parse_policy(text, "p", env=ENV), upstream)
    try:
        yield gw
    finally:
        for writer in keep or ():
            writer.close()
        await gw.session.close()
        await runner.cleanup()


def address(gw: Gateway) -> tuple[str, int]:
    host, port = gw.url.removeprefix("http://").split(":")
    return host, int(port)


async def trickler(gw: Gateway, stop: asyncio.Event) -> None:
    """Open, send a header byte now and then, reconnect when cut: forever, until `stop`."""
    while not stop.is_set():
        with contextlib.suppress(OSError, ConnectionError):
            reader, writer = await asyncio.open_connection(*address(gw))
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            while not stop.is_set() and not reader.at_eof():
                writer.write(b"X")
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader.read(1024), 0.3)
            writer.close()
        await asyncio.sleep(0)


def raw_request(tenant: str, stream: bool = True) -> bytes:
    body = b'{"model":"smollm2","messages":[],"stream":' + (b"true}" if stream else b"false}")
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + KEYS[tenant].encode() + b"\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


async def answer_head(gw: Gateway, raw: bytes, keep: list[asyncio.StreamWriter]) -> bytes:
    """Send `raw` on a new connection: the answer's head, or b"" when closed without one; the
    connection stays open (in `keep`)."""
    reader, writer = await asyncio.open_connection(*address(gw))
    keep.append(writer)
    writer.write(raw)
    try:
        async with asyncio.timeout(10):
            return await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return b""


def status_of(head: bytes) -> str:
    return head[9:12].decode() if head.startswith(b"HTTP/1.1 ") else "none"


async def test_a_normal_clients_every_request_is_served_through_a_reconnecting_flood(
    upstream: FakeUpstream,
) -> None:
    async with capped(upstream) as gw:
        pressure = gw.app[PRESSURE]
        stop = asyncio.Event()
        flood = [asyncio.create_task(trickler(gw, stop)) for _ in range(150)]
        try:
            await until(lambda: pressure.admitted == 48 and pressure.held >= 50, 10, "the flood")
            grown = pressure.tick + GRACE_TICKS
            await until(lambda: pressure.tick > grown, 10, "the flood past its grace")
            connector = aiohttp.TCPConnector(force_close=True)  # a fresh connection each time
            seen = Counter[int]()
            async with aiohttp.ClientSession(connector=connector) as normal:
                for _ in range(30):
                    async with normal.post(
                        gw.url + "/v1/chat/completions",
                        json={"model": "smollm2", "messages": []},
                        headers={"authorization": f"Bearer {KEYS['acme']}"},
                        timeout=aiohttp.ClientTimeout(total=10),
                    ) as resp:
                        seen[resp.status] += 1
            assert seen == {200: 30}
        finally:
            stop.set()
            await asyncio.gather(*flood, return_exceptions=True)


async def test_a_burst_beyond_the_cap_is_answered_and_probes_stay_up() -> None:
    upstream = FakeUpstream(mode="hold")
    await upstream.start()
    keep: list[asyncio.StreamWriter] = []
    try:
        async with capped(upstream, keep=keep) as gw:
            heads = await asyncio.gather(*(answer_head(gw, raw_request("acme"), keep)
                                           for _ in range(120)))  # fmt: skip
            statuses = Counter(status_of(h) for h in heads)
            assert statuses == {"200": 48, "503": 72}, statuses  # every one got an HTTP status
            refused = [h.lower() for h in heads if status_of(h) == "503"]
            assert all(b"retry-after: 1" in h and b"connection: close" in h for h in refused)
            for path in ("/healthz", "/readyz") * 5:
                raw = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
                reader, writer = await asyncio.open_connection(*address(gw))
                keep.append(writer)
                writer.write(raw)
                async with asyncio.timeout(10):
                    answer = await reader.read()
                assert answer.startswith(b"HTTP/1.1 200") and b"busy: connections" in answer
    finally:
        await upstream.close()


@pytest.mark.parametrize("per_client", [4])
async def test_a_cap_counts_a_tenant_by_its_key_not_its_address(per_client: int) -> None:
    upstream = FakeUpstream(mode="hold")
    await upstream.start()
    keep: list[asyncio.StreamWriter] = []
    limits = f"max_body_bytes: 65536, max_connections: 8, max_connections_per_client: {per_client}"
    try:
        async with capped(upstream, limits, keep) as gw:
            greedy = await asyncio.gather(*(answer_head(gw, raw_request("globex"), keep)
                                            for _ in range(8)))  # fmt: skip
            assert Counter(map(status_of, greedy)) == {"200": per_client, "503": 8 - per_client}
            normal = [await answer_head(gw, raw_request("acme"), keep) for _ in range(3)]
            assert [status_of(h) for h in normal] == ["200"] * 3
    finally:
        await upstream.close()
