"""The control plane's promises measured from outside the process that keeps them: token budgets
and tokens per minute under waves of 20 concurrent requests in every framing a server uses for
its usage (tokens served against the limit), and a fleet of two gateway replicas on a real
PostgreSQL and Redis through a Redis restart, a database restore from a backup taken before a
revocation, and a 30 s database outage under load (statuses per phase; changes refused while it
is down and none lost). Prints the figures and writes bench/results/control_plane.json.

    .venv/bin/python -m bench.control_plane [--outage-s 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp

from bench.machine import describe
from gateway.fleet.budgeter import BUDGETS
from gateway.policy.load import parse_policy
from gateway.server import bound_port, start_admin
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.fleet_policies import fleet_policy_text, replica
from tests.kit.gateway import ENV, Gateway, policy_text, run_gateway
from tests.kit.postgres_server import PASSWORD, PostgresServer
from tests.kit.redis_server import RedisServer
from tests.kit.slow_upstream import FRAMINGS, SlowUpstream

ROOT = Path(__file__).resolve().parents[1]
BODY = {"model": "smollm2", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
TOKEN = "admin-token-0123456789abcdef"


async def _waves(gw: Gateway, stream: bool, waves: int = 6) -> list[int]:
    statuses: list[int] = []
    body = {**BODY, "stream": True} if stream else BODY
    for _ in range(waves):
        wave = await asyncio.gather(*(gw.chat("acme", body) for _ in range(20)))
        for r in wave:
            await r.read()
        statuses += [r.status for r in wave]
        if 200 not in [r.status for r in wave]:
            break
    return statuses


async def limits(folder: Path) -> list[dict[str, Any]]:
    rows = []
    for framing in FRAMINGS:
        for kind, field in (("budget day=60", "budgets: {day: 60}"),
                            ("tokens_per_min=60", "limits: {tokens_per_min: 60}")):  # fmt: skip
            up = SlowUpstream(framing)
            await up.start()
            text = policy_text(up.url, header_s=10).replace("id: acme, ", f"id: acme, {field}, ")
            state = folder / f"{framing}-{kind.split()[0]}"
            state.mkdir()
            gw, runner = await run_gateway(parse_policy(text, "p.yaml", env=ENV), FakeUpstream(),
                                           state_dir=state)  # fmt: skip
            try:
                statuses = await _waves(gw, framing.startswith("sse"))
                served = statuses.count(200)
                spent = (await gw.app[BUDGETS].spent("tenant:acme"))["day"]
                # tokens per minute: what the answers' usage says (no usage: not observable)
                used: int | None = spent if kind.startswith("budget") else 13 * served
                if kind.startswith("tokens") and "no_usage" in framing:
                    used = None
                over = None if used is None else max(0, used - 60)
                rows.append({"framing": framing, "limit": kind, "requests": len(statuses),
                             "served": served, "tokens": used, "over_by": over})  # fmt: skip
            finally:
                await gw.session.close()
                await runner.cleanup()
                await up.close()
    return rows


class Fleet:
    def __init__(self, pg: PostgresServer, redis: RedisServer, upstream: FakeUpstream) -> None:
        gateway = (
            f"  shared: {{redis: {{url: '{redis.url}', timeout_s: 0.5}}}}\n"
            f"  control: {{database: postgresql, url: '{pg.url}', password: {{env: PGPW}}}}\n"
            "  admin: {host: 127.0.0.1, port: 0, token: {env: ADMIN}}\n  state_dir: STATE\n"
        )
        text = fleet_policy_text(replica("a", upstream.url), gateway=gateway) + "registry: true\n"
        self.text = text.replace("  admin: {host: 127.0.0.1, port: 0}\n", "")
        self.upstream = upstream

    async def start(self, state: Path) -> tuple[Gateway, Any]:
        await asyncio.to_thread(state.mkdir, exist_ok=True)
        env = {**ENV, "ADMIN": TOKEN, "PGPW": PASSWORD}
        policy = parse_policy(self.text.replace("STATE", str(state)), "p.yaml", env=env)
        return await run_gateway(policy, self.upstream)


async def status(url: str, key: str) -> int:
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        try:
            async with http.post(url + "/v1/chat/completions", json=CHAT,
                                 headers={"authorization": f"Bearer {key}"}) as resp:  # fmt: skip
                await resp.read()
                return resp.status
        except aiohttp.ClientError:
            return 0


async def admin_post(admin: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(headers={"authorization": f"Bearer {TOKEN}"}) as http,
        http.post(admin + path, json=body) as resp,
    ):
        return resp.status, await resp.json()


async def fleet(folder: Path, outage_s: float) -> dict[str, Any]:
    pg, rs, up = PostgresServer(), RedisServer(folder), FakeUpstream()
    await asyncio.to_thread(pg.init)
    rs.start()
    await up.start()
    f = Fleet(pg, rs, up)
    out: dict[str, Any] = {}
    started = [await f.start(folder / f"s{n}") for n in range(2)]
    admin_runner = await start_admin(started[0][0].app, "127.0.0.1", 0)
    admin = f"http://127.0.0.1:{bound_port(admin_runner)}"
    urls = [gw.url for gw, _ in started]
    try:
        await admin_post(admin, "/tenants", {"id": "team9"})
        _, kept = await admin_post(admin, "/keys", {"tenant": "team9"})
        _, doomed = await admin_post(admin, "/keys", {"tenant": "team9"})
        await asyncio.sleep(0.5)
        backup = await asyncio.to_thread(pg.dump)
        await admin_post(admin, f"/keys/{doomed['id']}/revoke", {})
        await asyncio.sleep(0.5)
        rs.stop()
        rs.start()
        await asyncio.sleep(1.0)
        out["after Redis restarted empty"] = {
            "revoked key": [await status(u, doomed["key"]) for u in urls],
            "kept key": [await status(u, kept["key"]) for u in urls],
            "new key": (await admin_post(admin, "/keys", {"tenant": "team9"}))[0],
        }
        await asyncio.to_thread(pg.restore, backup)
        await asyncio.sleep(1.0)
        out["database restored from before the revocation"] = {
            "revoked key, running replicas": [await status(u, doomed["key"]) for u in urls],
        }
        # The outage under load: 8 clients with the kept key through both replicas.
        phases: dict[str, Counter[int]] = {"before": Counter(), "down": Counter(),
                                           "after": Counter()}  # fmt: skip
        phase = "before"
        stop = asyncio.Event()

        async def client(n: int) -> None:
            while not stop.is_set():
                phases[phase][await status(urls[n % 2], kept["key"])] += 1

        clients = [asyncio.create_task(client(n)) for n in range(8)]
        await asyncio.sleep(3)
        await asyncio.to_thread(pg.stop)
        phase = "down"
        change_down = (await admin_post(admin, "/keys", {"tenant": "team9"}))[0]
        await asyncio.sleep(outage_s)
        await asyncio.to_thread(pg.start)
        phase = "after"
        await asyncio.sleep(3)
        change_after, minted = await admin_post(admin, "/keys", {"tenant": "team9"})
        await asyncio.sleep(3)
        stop.set()
        await asyncio.gather(*clients)
        out[f"database stopped {outage_s:g} s under load (8 clients)"] = {
            phase: dict(counts) for phase, counts in phases.items()
        } | {"a change while down": change_down, "a change after": change_after}
        out["the key minted after the outage, on both"] = [
            await status(u, minted["key"]) for u in urls
        ]
    finally:
        await admin_runner.cleanup()
        for gw, runner in started:
            await gw.session.close()
            await runner.cleanup()
    # Every replica restarted, and a new one on empty state.
    again = [await f.start(folder / "s0"), await f.start(folder / "new")]
    try:
        out["restarted and new replicas"] = {
            "revoked key": [await status(gw.url, doomed["key"]) for gw, _ in again],
            "kept key": [await status(gw.url, kept["key"]) for gw, _ in again],
        }
    finally:
        for gw, runner in again:
            await gw.session.close()
            await runner.cleanup()
        await up.close()
        rs.stop()
        await asyncio.to_thread(pg.remove)
    return out


async def main(outage_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kvfence-control-") as tmp:
        t0 = time.monotonic()
        rows = await limits(Path(tmp))
        print("20 requests at once, in waves until one is refused whole (13 tokens an answer):")
        head = ("framing", "limit", "requests", "served", "tokens", "over")
        print(f"  {head[0]:22} {head[1]:18} " + " ".join(f"{h:>8}" for h in head[2:]))
        for r in rows:
            cells = [r["requests"], r["served"], r["tokens"], r["over_by"]]
            line = " ".join(f"{'-' if c is None else c:>8}" for c in cells)
            print(f"  {r['framing']:22} {r['limit']:18} {line}")
        scenarios = await fleet(Path(tmp), outage_s)
        for name, figures in scenarios.items():
            print(f"{name}: {json.dumps(figures)}")
        return {"host": describe(torch_info=False), "limits": rows, "fleet": scenarios,
                "seconds": round(time.monotonic() - t0, 1)}  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outage-s", type=float, default=30.0)
    args = parser.parse_args()
    result = asyncio.run(main(args.outage_s))
    path = ROOT / "bench" / "results" / "control_plane.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {path}")
