"""Raw sockets against the real gateway: what the listener cannot frame unambiguously is refused,
the connection is closed, and nothing pipelined behind it ever reaches the upstream, with or
without an API key on the refused request. Framing ambiguities aiohttp's parser already refuses
stay refused. Valid HTTP/1.0 and 1.1 (keep-alive, pipelining) still work."""

from __future__ import annotations

import asyncio
import gzip
import logging
import zlib
from collections.abc import AsyncIterator

import pytest

from gateway.listener.edge import RateLimitedLog
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import KEYS, Gateway, make_policy, run_gateway
from tests.kit.probes import AUTH, CHUNKED, REFUSED, SMUGGLED, head, post


@pytest.fixture
async def edge_gw(upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    gateway, runner = await run_gateway(make_policy(upstream.url), upstream)
    yield gateway
    await gateway.session.close()
    await runner.cleanup()


async def exchange(gw: Gateway, raw: bytes, timeout_s: float = 5.0) -> tuple[bytes, bool]:
    """Send `raw` at once; everything the gateway answers, and whether it closed the
    connection (rather than keeping it open after its answers)."""
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(raw)
    await writer.drain()
    data, closed = b"", False
    try:
        async with asyncio.timeout(timeout_s):
            while chunk := await reader.read(65536):
                data += chunk
            closed = True
    except TimeoutError:
        pass
    except ConnectionResetError:
        closed = True
    writer.close()
    return data, closed


def status_lines(data: bytes) -> list[bytes]:
    """The status line of each response in `data` (each framed by its Content-Length)."""
    lines: list[bytes] = []
    while data:
        header, sep, rest = data.partition(b"\r\n\r\n")
        assert sep, f"unframed bytes: {data[:80]!r}"
        first, *fields = header.split(b"\r\n")
        lines.append(first)
        length = [int(f.split(b":")[1]) for f in fields if f.lower().startswith(b"content-length:")]
        assert len(length) == 1, header
        data = rest[length[0] :]
    return lines


async def malformed_count(gw: Gateway) -> float:
    text = await gw.metrics()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("kvfence_gateway_malformed_requests_total{")
    )


@pytest.mark.parametrize(("name", "raw", "status"), REFUSED, ids=[c[0] for c in REFUSED])
async def test_refused_and_nothing_behind_it_is_forwarded(
    edge_gw: Gateway, name: str, raw: bytes, status: int
) -> None:
    before = await malformed_count(edge_gw)
    data, closed = await exchange(edge_gw, raw)
    [line] = status_lines(data)
    assert line.split(b" ")[1] == str(status).encode(), (name, data[:300])
    assert line.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), line
    assert closed, f"{name}: the connection stayed open"
    if status == 405:
        assert b"\r\nallow: GET, POST\r\n" in data
    # The same with two authenticated requests pipelined behind it: one answer (where the
    # pipelined bytes make the whole stream unparseable, the parser's 400), then the close.
    data, closed = await exchange(edge_gw, raw + SMUGGLED + SMUGGLED)
    [line] = status_lines(data)
    assert line.split(b" ")[1] in (str(status).encode(), b"400"), (name, data[:300])
    assert closed, f"{name}: the connection stayed open"
    assert edge_gw.upstream.received == []
    assert await malformed_count(edge_gw) == before + 2


async def test_valid_pipelined_requests_still_work(edge_gw: Gateway) -> None:
    """The control: keep-alive and pipelining on 1.1, and 1.0 without Host, are served."""
    data, _ = await exchange(edge_gw, SMUGGLED + SMUGGLED, timeout_s=3)
    assert [line.split(b" ")[1] for line in status_lines(data)] == [b"200", b"200"]
    assert len(edge_gw.upstream.received) == 2
    data, _ = await exchange(edge_gw, b"GET /healthz HTTP/1.0\r\n\r\n", timeout_s=3)
    assert status_lines(data) == [b"HTTP/1.0 200 OK"]
    chunked = head(
        b"POST /v1/chat/completions HTTP/1.1",
        b"Host: 127.0.0.1:8080\r\n" + AUTH + b"Transfer-Encoding: chunked\r\n",
        CHUNKED,
    )
    data, _ = await exchange(edge_gw, chunked, timeout_s=3)
    assert status_lines(data)[0].split(b" ")[1] == b"200"
    assert edge_gw.upstream.received[-1].json["messages"][0]["content"] == "smuggled"


async def test_bad_compression_is_a_400_not_a_500(edge_gw: Gateway) -> None:
    raw = post(extra=b"Content-Encoding: gzip\r\n", body=b"not gzip at all")
    data, _ = await exchange(edge_gw, raw, timeout_s=3)
    assert status_lines(data)[0].split(b" ")[1] == b"400"
    assert b"malformed_body" in data
    assert edge_gw.upstream.received == []


async def compressed(gw: Gateway, data: bytes, encoding: str) -> tuple[int, bytes]:
    headers = {
        **gw.auth("acme"),
        "content-type": "application/json",
        "content-encoding": encoding,
    }
    async with gw.session.post(gw.url + "/v1/chat/completions", data=data, headers=headers) as r:
        return r.status, await r.read()


async def test_a_gzip_body_is_decoded(edge_gw: Gateway) -> None:
    body = b'{"model": "smollm2", "messages": [{"role": "user", "content": "zipped"}]}'
    for encoding, data in [("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))]:
        status, _ = await compressed(edge_gw, data, encoding)
        assert status == 200
        assert edge_gw.upstream.received[-1].json["messages"][0]["content"] == "zipped"


async def test_a_compression_bomb_stops_at_the_body_cap(edge_gw: Gateway) -> None:
    """64 MiB of spaces inside a valid JSON string, sent as 65 KB: a 413 at the 64 KiB cap."""
    bomb = gzip.compress(b'{"model": "smollm2", "messages": [], "x": "' + b" " * (64 << 20) + b'"}')
    assert len(bomb) < 100_000
    status, data = await compressed(edge_gw, bomb, "gzip")
    assert status == 413 and b"body_too_large" in data
    assert edge_gw.upstream.received == []


@pytest.mark.parametrize("encoding", ["compress", "gzip, gzip", "rot13", "br", "zstd"])
async def test_other_encodings_are_refused(edge_gw: Gateway, encoding: str) -> None:
    """A 415 from the gateway; br and zstd, which aiohttp's parser itself refuses when their
    decoder is not installed, are its 400 instead. Either way nothing is forwarded."""
    status, data = await compressed(edge_gw, b'{"model": "smollm2", "messages": []}', encoding)
    if status != 415:
        assert encoding in ("br", "zstd") and status == 400
    else:
        assert b"unsupported_content_encoding" in data
    assert edge_gw.upstream.received == []


async def test_client_garbage_never_logs_at_error_level(
    edge_gw: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    """Every probe is refused and counted; the log gets no error line, no request bytes, and
    at most one line per reason per second."""
    caplog.set_level(logging.DEBUG)
    probes = [raw for _, raw, _ in REFUSED] * 3
    for raw in probes:
        await exchange(edge_gw, raw)
    assert await malformed_count(edge_gw) == len(probes)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    edge_lines = [r for r in caplog.records if r.name == "kvfence.gateway.edge"]
    reasons = {getattr(r, "reason", None) for r in edge_lines}
    assert len(edge_lines) < len(probes)
    assert len(reasons) >= 5
    text = "\n".join(r.getMessage() + str(r.__dict__) for r in caplog.records)
    assert KEYS["acme"] not in text and "smuggled" not in text


def test_rate_limited_log_keeps_one_line_per_reason_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kvfence.gateway.edge")
    now = [0.0]
    lines = RateLimitedLog(1.0, clock=lambda: now[0])
    written = [lines.info(reason, "refused") for reason in ("a", "a", "b", "a", "b")]
    assert written == [True, False, True, False, False]
    now[0] = 1.5
    assert lines.info("a", "refused") and lines.info("b", "refused")
    assert [getattr(r, "suppressed", None) for r in caplog.records] == [0, 0, 2, 1]
