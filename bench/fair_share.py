"""The fair-share figures: a normal client's success rate during a reconnecting trickle flood,
tenant A's cached tokens and first-token time under tenant B's flood (B scoped by tenant and by
user), and the gateway's memory under a 200 MiB plain upstream answer. Prints them and writes
bench/results/fair_share.json.

    .venv/bin/python -m bench.fair_share [--flood-s 20] [--flooders 1100]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp

from bench.machine import describe
from tests.kit.gateway import ENV, KEYS, policy_text
from tests.kit.gateway_process import gateway_process
from tests.kit.stack import make_backend, make_keys, running_stack
from tests.kit.vllm_server import free_port

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "fair_share.json"


def _flooder(port: int, count: int, seconds: float) -> None:
    """A separate process: `count` connections trickling headers, reconnecting when cut."""

    async def one(stop: float) -> None:
        while time.monotonic() < stop:
            with contextlib.suppress(OSError):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
                while time.monotonic() < stop and not reader.at_eof():
                    writer.write(b"X")
                    with contextlib.suppress(TimeoutError, OSError):
                        await writer.drain()
                        await asyncio.wait_for(reader.read(1024), 0.5)
                writer.close()
            await asyncio.sleep(0)

    async def run() -> None:
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # writes to cut sockets: expected
        stop = time.monotonic() + seconds
        await asyncio.gather(*(one(stop) for _ in range(count)))

    asyncio.run(run())


async def flood(seconds: float, flooders: int, tmp: Path) -> dict[str, Any]:
    from tests.fakes.openai_upstream import FakeUpstream

    fake = FakeUpstream()
    await fake.start()
    port = free_port()
    text = policy_text(fake.url).replace("port: 0}", f"port: {port}}}", 1)
    text = text.replace("max_body_bytes: 65536", "max_body_bytes: 65536, max_connections: 256")
    text = text.replace("header_timeout_s: 0.5, ", "header_timeout_s: 10, ")
    path = tmp / "flood.yaml"
    path.write_text(text)
    url = f"http://127.0.0.1:{port}"
    ok = tried = 0
    with gateway_process(path, url, workers=1, env=ENV):
        proc = multiprocessing.Process(target=_flooder, args=(port, flooders, seconds + 2))
        proc.start()
        await asyncio.sleep(2)
        stop = time.monotonic() + seconds
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as http:
            while time.monotonic() < stop:
                tried += 1
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.post(
                        url + "/v1/chat/completions",
                        json={"model": "smollm2", "messages": []},
                        headers={"authorization": f"Bearer {KEYS['acme']}"},
                        timeout=aiohttp.ClientTimeout(total=5),
                    ) as resp:
                        ok += resp.status == 200
                await asyncio.sleep(0.1)
        proc.join()
    await fake.close()
    return {"flooders": flooders, "seconds": seconds, "normal_requests": tried,
            "served": ok, "success": round(ok / max(1, tried), 3)}  # fmt: skip


async def eviction(tmp: Path, b_scope: str) -> dict[str, Any]:
    from backend.model.load import load_model

    model = load_model("smollm2")
    (tmp / b_scope).mkdir()
    keys = make_keys(tmp / b_scope)
    settings = {"globex": f"scope: {b_scope}"}
    prompt = "Our refund policy, in full: damaged pallets are refunded within thirty days. " * 8
    async with running_stack(make_backend(model, keys, blocks=256), keys, model.name,
                             tenants=settings) as stack:  # fmt: skip

        async def ask(tenant: str, text: str, **extra: str) -> tuple[int, float]:
            body = {"model": model.name, "prompt": text, "max_tokens": 1, **extra}
            started = time.perf_counter()
            resp = await stack.post(tenant, body, path="/v1/completions")
            doc = await resp.json()
            return doc["usage"]["prompt_tokens_details"][
                "cached_tokens"
            ], time.perf_counter() - started

        await ask("acme", prompt)
        before = await ask("acme", prompt)
        for i in range(120):
            extra = {"user": f"u{i}"} if b_scope == "user" else {}
            await ask("globex", f"filler number {i} " * 40, **extra)
        after = await ask("acme", prompt)
    return {"b_scope": b_scope, "before": {"cached": before[0], "ms": round(before[1] * 1e3)},
            "after": {"cached": after[0], "ms": round(after[1] * 1e3)}}  # fmt: skip


async def big_answer(tmp: Path) -> dict[str, Any]:
    port, up_port = free_port(), free_port()
    body = b'{"choices":[{"message":{"content":"' + b"x" * (200 << 20) + b'"}}]}'

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n")  # fmt: skip
        for i in range(0, len(body), 1 << 20):
            writer.write(body[i : i + (1 << 20)])
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", up_port)
    text = policy_text(f"http://127.0.0.1:{up_port}").replace("port: 0}", f"port: {port}}}", 1)
    path = tmp / "big.yaml"
    path.write_text(text.replace("header_timeout_s: 0.5, ", ""))
    url = f"http://127.0.0.1:{port}"
    with gateway_process(path, url, workers=1, env=ENV) as proc:
        async with aiohttp.ClientSession() as http, http.post(
            url + "/v1/chat/completions", json={"model": "smollm2", "messages": []},
            headers={"authorization": f"Bearer {KEYS['acme']}"},
        ) as resp:  # fmt: skip
            status = resp.status
            await resp.read()
        peak = await asyncio.to_thread(_peak_rss_kib, proc.pid)
    server.close()
    return {"answer_bytes": len(body), "status": status, "gateway_peak_rss_mb": round(peak / 1024)}


def _peak_rss_kib(pid: int) -> int:
    """The largest peak resident set (VmHWM) of `pid` and its descendants."""
    peak, todo = 0, [pid]
    while todo:
        current = todo.pop()
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmHWM"):
                    peak = max(peak, int(line.split()[1]))
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    return peak


async def main(args: argparse.Namespace) -> None:
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # writes to sockets the gateway cut
    result: dict[str, Any] = {"host": describe()}
    with tempfile.TemporaryDirectory() as tmp:
        result["flood"] = await flood(args.flood_s, args.flooders, Path(tmp))
        print("reconnecting flood:", result["flood"])
        result["eviction"] = [await eviction(Path(tmp), s) for s in ("tenant", "user")]
        print("eviction:", result["eviction"])
        result["big_answer"] = await big_answer(Path(tmp))
        print("200 MiB answer:", result["big_answer"])
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flood-s", type=float, default=20.0)
    parser.add_argument("--flooders", type=int, default=1100)
    asyncio.run(main(parser.parse_args()))
