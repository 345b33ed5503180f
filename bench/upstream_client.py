"""CPU per upstream request of the relay's own client (gateway.relay.client) beside aiohttp's
client as the gateway configured it before, in one run: 8 concurrent callers post a small chat
body to a raw loopback server (its own process) that answers a fixed JSON answer, plain or as a
short SSE stream, and read each answer to its end. Rounds alternate the two clients; the figure
is the median round. Prints the figures and writes bench/results/upstream_client.json.

    .venv/bin/python -m bench.upstream_client [--requests 4000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
from yarl import URL

from bench.machine import describe
from gateway.relay.client import UpstreamClient

OUT = Path(__file__).parent / "results" / "upstream_client.json"
BODY = b'{"model":"smollm2","messages":[{"role":"user","content":"hi"}],"cache_salt":"abc"}'
HEADERS = {"content-type": "application/json", "x-request-id": "0123456789abcdef"}
CALLERS = 8

# The server: a raw asyncio protocol (so its own cost stays out of the client's process).
SERVER = r"""
import asyncio, sys, uvloop
answer = b'{"id":"c1","object":"chat.completion","model":"smollm2","choices":[{"index":0,' \
         b'"finish_reason":"stop","message":{"role":"assistant","content":"Hello there!"}}],' \
         b'"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}}'
plain = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" \
        % len(answer) + answer
event = b'data: {"choices":[{"index":0,"delta":{"content":"token"}}]}\n\n'
chunk = b"%x\r\n%s\r\n" % (len(event), event)
sse = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked" \
      b"\r\n\r\n" + chunk * 16 + b"0\r\n\r\n"
reply = sse if sys.argv[2] == "sse" else plain
class Serve(asyncio.Protocol):
    def connection_made(self, transport): self.t, self.buf = transport, b""
    def data_received(self, data):
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = self.buf[:end].lower()
            at = head.find(b"content-length:")
            size = int(head[at + 15:].split(b"\r\n")[0]) if at >= 0 else 0
            if len(self.buf) < end + 4 + size:
                return
            self.buf = self.buf[end + 4 + size:]
            self.t.write(reply)
async def main():
    server = await asyncio.get_running_loop().create_server(Serve, "127.0.0.1", int(sys.argv[1]))
    print("ready", flush=True)
    await asyncio.Event().wait()
uvloop.run(main())
"""


def _cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _aiohttp(url: URL, requests: int) -> None:
    # As gateway/relay/session.py configured the session the relay used.
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    async with aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding"),
    ) as session:

        async def caller() -> None:
            for _ in range(requests // CALLERS):
                answer = await session.post(url, data=BODY, headers=HEADERS)
                try:
                    while await answer.content.readany():
                        pass
                finally:
                    answer.release()

        await asyncio.gather(*(caller() for _ in range(CALLERS)))


async def _relay(url: URL, requests: int) -> None:
    client = UpstreamClient()

    async def caller() -> None:
        for _ in range(requests // CALLERS):
            answer = await client.post(url, BODY, HEADERS, 5.0)
            try:
                while await answer.readany():
                    pass
            finally:
                answer.release()

    try:
        await asyncio.gather(*(caller() for _ in range(CALLERS)))
    finally:
        client.close()


Run = Callable[[URL, int], Awaitable[None]]


async def _measure(run: Run, url: URL, requests: int) -> dict[str, float]:
    cpu, wall = _cpu_s(), time.perf_counter()
    await run(url, requests)
    cpu, wall = _cpu_s() - cpu, time.perf_counter() - wall
    return {"cpu_us_per_request": 1e6 * cpu / requests, "requests_per_s": requests / wall}


def _scenario(kind: str, requests: int, rounds: int) -> dict[str, Any]:
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port), kind], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        url = URL(f"http://127.0.0.1:{port}/v1/chat/completions")
        clients: dict[str, Run] = {"aiohttp": _aiohttp, "relay": _relay}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in clients}
        for _ in range(rounds):
            for name, run in clients.items():
                runs[name].append(uvloop.run(_measure(run, url, requests)))
    finally:
        server.terminate()
        server.wait()
    out: dict[str, Any] = {"runs": runs}
    for name, found in runs.items():
        out[name] = {key: statistics.median(r[key] for r in found) for key in found[0]}
    out["relay_vs_aiohttp_cpu"] = (
        out["relay"]["cpu_us_per_request"] / out["aiohttp"]["cpu_us_per_request"]
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=4000, help="per round and client")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    result: dict[str, Any] = {"machine": describe(torch_info=False), "callers": CALLERS,
                              "requests": args.requests, "rounds": args.rounds}  # fmt: skip
    for kind in ("plain", "sse"):
        found = result[kind] = _scenario(kind, args.requests, args.rounds)
        for name in ("aiohttp", "relay"):
            figures = found[name]
            print(f"{kind:5s} {name:7s} {figures['cpu_us_per_request']:7.1f} us CPU/request "
                  f"{figures['requests_per_s']:8.0f} req/s")  # fmt: skip
        print(f"{kind:5s} relay/aiohttp CPU {found['relay_vs_aiohttp_cpu']:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
