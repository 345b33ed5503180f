"""The pressure figures, measured on whichever checkout is first on `sys.path`, so the
same harness measures the code before and after the change:

    .venv/bin/python -m bench.pressure                        # this checkout, label "after"
    (cd OLD && PYTHONPATH=. python -m bench.pressure --label before)   # with bench/ and
        # tests/fakes/ copied into OLD

Prints one JSON object and writes it to bench/results/pressure-LABEL.json. Sections:
quarantine (tenant requests reaching a quarantined backend after Redis restarts empty),
connections (bare closes in a burst and under overload; /healthz during overload), flood (a
normal client's share served through a reconnecting trickle flood from its own address),
disconnects (plain requests whose client left, and their audit records), cut_streams (tokens
admitted past tokens_per_min when clients cut their streams before the usage chunk).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import orjson  # noqa: E402

from bench.machine import describe  # noqa: E402
from tests.fakes.openai_upstream import FakeUpstream  # noqa: E402
from tests.kit.audit_processes import free_port, launch  # noqa: E402
from tests.kit.gateway import ENV, KEYS, policy_text, run_gateway  # noqa: E402
from tests.kit.polling import until  # noqa: E402

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}


def _limits(text: str, limits: str) -> str:
    return text.replace(
        "limits: {header_timeout_s: 0.5, body_timeout_s: 0.5, max_body_bytes: 65536}",
        f"limits: {{{limits}}}",
    )


@contextlib.asynccontextmanager
async def _gateway_process(upstream_url: str, limits: str) -> AsyncIterator[int]:
    """A real `kvfence gateway` (one worker) in its own process, on a fresh port."""
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        text = _limits(policy_text(upstream_url), limits)
        text = text.replace("port: 0}\n  admin", f"port: {port}}}\n  admin", 1)
        policy = Path(tmp) / "p.yaml"
        policy.write_text(text)
        proc, _ = await launch(policy, port, workers=1)
        try:
            yield port
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()


# --- quarantine across Redis restarts ------------------------------------------------------


async def quarantine(runs: int, requests: int) -> dict[str, Any]:
    from gateway.verify.service import VERIFY
    from gateway.verify.watch import WATCH
    from tests.kit.redis_server import RedisServer
    from tests.kit.shared_gateways import two_gateways

    reached, served, statuses = [], [], Counter[object]()
    quarantined = {"quarantined": True, "quarantine_reason": "bench"}
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            server = RedisServer(Path(tmp))
            server.start()
            try:
                async with two_gateways(server) as (one, two, a, _):
                    change = partial(dataclasses.replace, **quarantined)
                    await one.app[WATCH].apply("a", change)
                    board = two.app[VERIFY].health
                    await until(lambda board=board: board.get("a").quarantined, 5, "agreement")
                    await asyncio.to_thread(server.stop)
                    await asyncio.to_thread(server.start)  # same port, empty
                    before, ok = len(a.received), 0
                    for tried in range(requests):
                        gw = (one, two)[tried % 2]
                        tenant = ("acme", "globex", "initech")[tried % 3]
                        user = f"user-{tried % 7}"  # several namespaces: some rank `a` first
                        try:
                            resp = await gw.chat(tenant, CHAT, **{"x-end-user": user})
                            await resp.read()
                        except aiohttp.ClientError as exc:  # a keep-alive race: counted
                            statuses[type(exc).__name__] += 1
                            continue
                        statuses[resp.status] += 1
                        ok += resp.status == 200
                        await asyncio.sleep(0.1)  # spread over the seconds after the restart
                    reached.append(len(a.received) - before)
                    served.append(ok)
            finally:
                server.stop()
    return {
        "runs": runs,
        "requests_per_run": requests,
        "served_per_run": served,
        "reaching_quarantined_backend_per_run": reached,
        "runs_with_any": sum(1 for n in reached if n),
        "statuses": dict(statuses),
    }


# --- connection caps -------------------------------------------------------------------------


def _stream_request() -> bytes:
    body = b'{"model":"smollm2","messages":[],"stream":true}'
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + KEYS["acme"].encode() + b"\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


async def _held(
    port: int, raw: bytes, done: asyncio.Event, wait_s: float, seen: list[str] | None = None
) -> str:
    """Send `raw` on a fresh connection: its status code, `bare` (closed or reset with no
    status line) or `none` (nothing within `wait_s`), also appended to `seen`; the connection
    stays open until `done`."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        outcome, writer = "connect_failed", None
    else:
        try:
            writer.write(raw)
            async with asyncio.timeout(wait_s):
                line = await reader.readuntil(b"\r\n")
            outcome = line.split(b" ")[1].decode() if line.startswith(b"HTTP/1.") else "garbled"
        except (asyncio.IncompleteReadError, ConnectionError):
            outcome = "bare"
        except TimeoutError:
            outcome = "none"
    if seen is not None:
        seen.append(outcome)
    await done.wait()
    if writer is not None:
        writer.close()
    return outcome


async def _probe(port: int, path: str) -> str:
    raw = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    done = asyncio.Event()
    done.set()
    return await _held(port, raw, done, 5.0)


async def connections(sizes: list[int], probes: int) -> dict[str, Any]:
    upstream = FakeUpstream(mode="hold")
    await upstream.start()
    out: dict[str, Any] = {}
    limits = "header_timeout_s: 10, body_timeout_s: 10, max_body_bytes: 65536"
    try:
        for size in sizes:
            async with _gateway_process(upstream.url, limits) as port:
                done, seen = asyncio.Event(), []
                tasks = [
                    asyncio.create_task(_held(port, _stream_request(), done, 30.0, seen))
                    for _ in range(size)
                ]
                await asyncio.sleep(1.0)  # the burst is in: now the probes, during overload
                health = Counter[str]()
                for _ in range(probes):
                    health[await _probe(port, "/healthz")] += 1
                    await asyncio.sleep(0.1)
                with contextlib.suppress(AssertionError):  # some never answered: counted
                    await until(lambda seen=seen, size=size: len(seen) >= size, 40)
                done.set()
                counts = Counter(await asyncio.gather(*tasks))
                out[str(size)] = {
                    "outcomes": dict(sorted(counts.items())),
                    "bare_closes": counts["bare"],
                    "no_answer": counts["none"],
                    "healthz": dict(health),
                    "healthz_failures": probes - health["200"],
                }
    finally:
        await upstream.close()
    return out


# --- a reconnecting trickle flood --------------------------------------------------------------


async def _trickler(port: int, stop: asyncio.Event) -> None:
    """Open, send a header byte now and then, reconnect when cut: until `stop`."""
    while not stop.is_set():
        with contextlib.suppress(OSError, ConnectionError):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            while not stop.is_set() and not reader.at_eof():
                writer.write(b"X")
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader.read(1024), 0.3)
            writer.close()
        await asyncio.sleep(0)


async def flood(tricklers: int, turns: int, per_turn: int) -> dict[str, Any]:
    upstream = FakeUpstream()
    await upstream.start()
    limits = "header_timeout_s: 3, body_timeout_s: 10, max_body_bytes: 65536, max_connections: 48"
    shares, statuses = [], Counter[str]()
    try:
        async with _gateway_process(upstream.url, limits) as port:
            stop = asyncio.Event()
            flood = [asyncio.create_task(_trickler(port, stop)) for _ in range(tricklers)]
            await asyncio.sleep(2.0)  # the flood holds every slot by now
            connector = aiohttp.TCPConnector(force_close=True)  # a fresh connection each time
            async with aiohttp.ClientSession(connector=connector) as normal:
                for _ in range(turns):
                    served = 0
                    for _ in range(per_turn):
                        try:
                            async with normal.post(
                                f"http://127.0.0.1:{port}/v1/chat/completions",
                                json=CHAT,
                                headers={"authorization": f"Bearer {KEYS['acme']}"},
                                timeout=aiohttp.ClientTimeout(total=10),
                            ) as resp:
                                await resp.read()
                                statuses[str(resp.status)] += 1
                                served += resp.status == 200
                        except (aiohttp.ClientError, TimeoutError) as exc:
                            statuses[type(exc).__name__] += 1
                    shares.append(round(served / per_turn, 3))
            stop.set()
            await asyncio.gather(*flood, return_exceptions=True)
    finally:
        await upstream.close()
    return {
        "tricklers": tricklers,
        "requests_per_turn": per_turn,
        "share_served_per_turn": shares,
        "share_served": round(sum(shares) / len(shares), 3),
        "outcomes": dict(statuses),
    }


async def floods(sizes: list[int]) -> dict[str, Any]:
    return {str(n): await flood(n, 2, 50) for n in sizes}


# --- plain requests whose client leaves --------------------------------------------------------


def _audit_policy(tmp: Path, url: str, extra: str = "") -> Any:
    from gateway.policy.load import parse_policy

    (tmp / "audit").mkdir()
    (tmp / "audit.key").write_bytes(b"k" * 32)
    audit = (
        f"access_log: false\n  audit_log: {{path: {tmp}/audit/audit.jsonl, "
        f"key: {{file: {tmp}/audit.key}}}}"
    )
    text = policy_text(url).replace("access_log: false", audit) + extra
    return parse_policy(text, str(tmp / "p.yaml"), env=ENV)


def _records(tmp: Path) -> list[dict[str, Any]]:
    lines = (tmp / "audit" / "audit.jsonl").read_bytes().splitlines()
    return [r for r in map(orjson.loads, lines) if r.get("kind") == "record"]


async def disconnects(count: int) -> dict[str, Any]:
    upstream = FakeUpstream(mode="stall_before")
    await upstream.start()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        gw, runner = await run_gateway(_audit_policy(tmp, upstream.url), upstream)
        ids = [f"leave-{i}-{os.urandom(4).hex()}" for i in range(count)]
        try:
            for rid in ids:
                seen = len(upstream.received)
                task = asyncio.create_task(gw.chat("acme", CHAT, **{"x-request-id": rid}))
                await until(lambda seen=seen: len(upstream.received) > seen, 10)
                task.cancel()  # the client leaves while the backend works on its request
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await asyncio.sleep(0.5)
        finally:
            await gw.session.close()
            await runner.cleanup()
            await upstream.close()
        records = [r for r in _records(tmp) if r.get("request_id") in ids]
    return {
        "plain_requests_left": count,
        "records": len(records),
        "records_status_499": sum(1 for r in records if r.get("status") == 499),
    }


# --- cut streams against tokens_per_min --------------------------------------------------------


async def cut_streams(count: int, tpm: int, cut_after: int = 40) -> dict[str, Any]:
    """Each stream is cut after `cut_after` content events (one token each) of the fake's 64,
    before its usage chunk; the prompt is 12 tokens."""
    upstream = FakeUpstream(mode="long")
    await upstream.start()
    from gateway.policy.load import parse_policy

    raw = _limits(policy_text(upstream.url), "header_timeout_s: 5, body_timeout_s: 5")
    raw = raw.replace("id: acme, ", f"id: acme, limits: {{tokens_per_min: {tpm}}}, ")
    gw, runner = await run_gateway(parse_policy(raw, "p.yaml", env=ENV), upstream)
    admitted, refused, events = 0, 0, 0
    try:
        for _ in range(count):
            resp = await gw.chat("acme", {**CHAT, "stream": True})
            if resp.status != 200:
                refused += 1
                await resp.read()
                continue
            admitted += 1
            seen = 0
            async for line in resp.content:
                seen += line.startswith(b"data: {")
                if seen == cut_after:
                    break
            events += seen
            resp.close()  # cut before the usage chunk
            await asyncio.sleep(0.05)
    finally:
        await gw.session.close()
        await runner.cleanup()
        await upstream.close()
    return {
        "tokens_per_min": tpm,
        "streams_tried": count,
        "admitted": admitted,
        "refused": refused,
        "completion_tokens_relayed": events,
        "tokens_relayed": events + admitted * 12,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.update(ENV)
    figures: dict[str, Any] = {"label": args.label, "machine": describe(torch_info=False)}
    sections = {
        "quarantine": lambda: quarantine(args.runs, 20),
        "connections": lambda: connections([600, 1000, 1500], 19),
        "flood": lambda: floods(args.tricklers),
        "disconnects": lambda: disconnects(20),
        "cut_streams": lambda: cut_streams(12, 400),
    }
    for name, section in sections.items():
        if args.only and name not in args.only:
            continue
        started = time.monotonic()
        try:
            figures[name] = await section()
        except Exception as exc:  # a section this checkout cannot run: record why
            figures[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        print(f"{name}: {time.monotonic() - started:.1f} s", file=sys.stderr)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--label", default="after")
    parser.add_argument("--runs", type=int, default=4, help="Redis restarts")
    parser.add_argument("--tricklers", type=int, nargs="+", default=[150, 400, 1000],
                        help="the floods' sizes (connections)")  # fmt: skip
    parser.add_argument("--only", nargs="*", help="sections to run (default: all)")
    args = parser.parse_args()
    figures = asyncio.run(run(args))
    text = json.dumps(figures, indent=2)
    print(text)
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    (results / f"pressure-{args.label}.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
