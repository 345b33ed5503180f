"""The relay's upstream client against a raw loopback server that answers with scripted bytes:
keep-alive reuse only after a whole answer, every framing (length, chunks, close-delimited, 1xx
first), a body larger than its buffer read whole, and each way an answer can fail named."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from yarl import URL

from gateway.relay import client as client_module
from gateway.relay.client import ConnectFailed, MalformedAnswer, UpstreamClient
from gateway.relay.failures import describe

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
Script = Callable[[bytes], list[bytes]]  # the request -> what is written back, piece by piece


class RawServer:
    """Reads each request (headers and a content-length body) and writes back what `script`
    says; an empty piece closes the connection there."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.url = URL()

    @staticmethod
    def at(server: RawServer, url: URL) -> RawServer:
        """The same server, asked at another URL."""
        other = RawServer(server.script)
        other.url = url
        return other

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = URL(f"http://127.0.0.1:{port}/v1/chat/completions")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                size = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                            if line.lower().startswith(b"content-length"))  # fmt: skip
                request = head + await reader.readexactly(size)
                self.requests.append(request)
                for piece in self.script(request):
                    if not piece:
                        writer.close()
                        return
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.01)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


Serve = Callable[[Script], Awaitable["RawServer"]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[RawServer] = []

    async def start(script: Script) -> RawServer:
        server = RawServer(script)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        assert server.server is not None
        server.server.close()
        for writer in server.writers:
            writer.close()
        await server.server.wait_closed()


async def post(upstream: UpstreamClient, server: RawServer, body: bytes = b"{}") -> bytes:
    answer = await upstream.post(server.url, body, {"content-type": "application/json"}, 2.0)
    try:
        parts = []
        while chunk := await answer.readany():
            parts.append(chunk)
        return b"".join(parts)
    finally:
        answer.release()


async def test_a_connection_is_reused_only_after_a_whole_answer(serve: Serve) -> None:
    server = await serve(lambda _: [OK])
    upstream = UpstreamClient()
    assert [await post(upstream, server) for _ in range(3)] == [b"{}"] * 3
    assert server.connections == 1
    answer = await upstream.post(server.url, b"{}", {}, 2.0)
    answer.release()  # its body left unread: the connection cannot be trusted again
    assert await post(upstream, server) == b"{}"
    assert server.connections == 2
    upstream.close()


async def test_a_second_release_never_pools_a_connection_in_use(serve: Serve) -> None:
    server = await serve(lambda request: [OK[:-2] + request[-2:]])  # each answer echoes its body
    upstream = UpstreamClient()
    first = await upstream.post(server.url, b"{}", {}, 2.0)
    assert await first.readany() == b"{}" and await first.readany() == b""
    first.release()
    second = await upstream.post(server.url, b"[]", {}, 2.0)  # the same connection, in use
    first.release()  # again: it must not pool that connection for a third request
    third = await upstream.post(server.url, b'""', {}, 2.0)
    assert [await second.readany(), await third.readany()] == [b"[]", b'""']
    second.release()
    third.release()
    assert server.connections == 2
    upstream.close()


async def test_the_request_is_the_line_host_length_and_the_callers_headers(
    serve: Serve,
) -> None:
    server = await serve(lambda _: [OK])
    upstream = UpstreamClient()
    await post(upstream, server, b'{"a":1}')
    port = server.url.port
    assert server.requests == [
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\ncontent-length: 7\r\n"
        b"content-type: application/json\r\n\r\n" % port + b'{"a":1}'
    ]
    await post(upstream, RawServer.at(server, server.url.with_user("u").with_password("p")))
    assert b"\r\nauthorization: Basic dTpw\r\n" in server.requests[-1]  # as aiohttp sent it
    with pytest.raises(ValueError, match="line break"):
        await upstream.post(server.url, b"{}", {"x-id": "a\r\nx-evil: 1"}, 2.0)
    upstream.close()


@pytest.mark.parametrize(
    "pieces",
    [
        [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n", b"3\r\ndef\r\n",
         b"0\r\n\r\n"],
        [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nabc",
         b"def"],
        [b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nabc", b"def", b""],
    ],
    ids=["chunked", "continue_first", "until_closed"],
)  # fmt: skip
async def test_every_framing_gives_the_whole_body(serve: Serve, pieces: list[bytes]) -> None:
    server = await serve(lambda _: pieces)
    upstream = UpstreamClient()
    assert await post(upstream, server) == b"abcdef"
    assert await post(upstream, server) == b"abcdef"
    assert server.connections == (2 if pieces[-1] == b"" else 1)
    upstream.close()


async def test_a_body_larger_than_the_buffer_arrives_whole_to_a_slow_reader(
    serve: Serve,
) -> None:
    body = bytes(range(256)) * 8192  # 2 MiB, eight times the point where reading pauses
    head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body)
    server = await serve(lambda _: [head + body])
    upstream = UpstreamClient()
    answer = await upstream.post(server.url, b"{}", {}, 2.0)
    parts = []
    while chunk := await answer.readany():
        parts.append(chunk)
        await asyncio.sleep(0.001)
    answer.release()
    assert b"".join(parts) == body
    assert await post(upstream, server) == body  # and the connection is whole after it
    assert server.connections == 1
    upstream.close()


@pytest.mark.parametrize(
    ("pieces", "error", "words"),
    [
        ([b""], aiohttp.ServerDisconnectedError, "closed by the backend before it answered"),
        ([b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", b""], aiohttp.ClientPayloadError,
         "answer cut short"),
        ([b"SMTP ready\r\n\r\n"], MalformedAnswer, "malformed answer"),
        ([b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"], MalformedAnswer,
         "malformed answer"),
    ],
    ids=["closed_before_answering", "cut_short", "not_http", "bad_chunk"],
)  # fmt: skip
async def test_a_broken_answer_is_a_named_client_error(
    serve: Serve, pieces: list[bytes], error: type[Exception], words: str
) -> None:
    server = await serve(lambda _: pieces)
    upstream = UpstreamClient()
    with pytest.raises(error) as raised:
        await post(upstream, server)
    assert isinstance(raised.value, aiohttp.ClientError)
    assert words in describe(raised.value)
    upstream.close()


async def test_bytes_after_the_answer_keep_its_connection_out_of_the_pool(serve: Serve) -> None:
    server = await serve(lambda _: [OK + OK])  # a second answer nobody asked for
    upstream = UpstreamClient()
    assert await post(upstream, server) == b"{}"
    assert await post(upstream, server) == b"{}"
    assert server.connections == 2
    upstream.close()


async def test_nothing_listening_is_connection_refused() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening
        upstream = UpstreamClient()
        with pytest.raises(ConnectFailed) as raised:
            await upstream.post(URL(f"http://127.0.0.1:{port}/v1/x"), b"{}", {}, 2.0)
    assert describe(raised.value).startswith("connection refused")


async def test_an_idle_connection_is_not_reused_past_its_keepalive(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "KEEPALIVE_S", 0.05)
    server = await serve(lambda _: [OK])
    upstream = UpstreamClient()
    await post(upstream, server)
    await asyncio.sleep(0.1)
    await post(upstream, server)
    assert server.connections == 2
    upstream.close()


async def test_a_cancelled_wait_closes_its_connection(serve: Serve) -> None:
    server = await serve(lambda _: [b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nab", b"cd"])
    upstream = UpstreamClient()
    answer = await upstream.post(server.url, b"{}", {}, 2.0)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.0):
            await answer.readany()
            await asyncio.sleep(1)
    answer.release()
    assert await post(upstream, server) == b"abcd"
    assert server.connections == 2
    upstream.close()


def test_under_uvloop_as_the_gateway_serves() -> None:
    """The gateway runs on uvloop, whose transports are not asyncio's classes."""
    uvloop = pytest.importorskip("uvloop")

    async def run() -> int:
        server = RawServer(lambda _: [OK])
        await server.start()
        upstream = UpstreamClient()
        try:
            assert [await post(upstream, server) for _ in range(3)] == [b"{}"] * 3
            return server.connections
        finally:
            upstream.close()
            assert server.server is not None
            server.server.close()
            for writer in server.writers:
                writer.close()

    assert uvloop.run(run()) == 1
