"""Affinity vs round robin over two of our backends, and how fast gateway replicas agree on a
quarantine. Two `kvfence backend` processes (SmolLM2 on the CPU), gateway processes sharing
one redis-server: the Mooncake conversation trace, scaled down (each conversation a namespace,
each 512-token block a few words), replayed after a warm-up through a gateway with
`routing.strategy: affinity` and through one with `round_robin`, `--repeats` times each in fresh
namespaces, alternating which goes first (the machine's load drifts); then quarantines written
to the shared state while both affinity replicas' /status are polled. Prints a table and writes
bench/results/fleet_routing.json.

    .venv/bin/python -m bench.fleet_routing [--conversations 16] [--turns 4] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp

from bench.machine import describe
from gateway.fleet.health import SharedHealthBoard
from gateway.fleet.local_health import REFRESH_S, Health
from gateway.fleet.metrics import FleetMetrics
from gateway.fleet.store import SharedStore
from gateway.metrics import Metrics
from gateway.policy.load import load_policy
from tests.kit.fleet_processes import (
    Backend,
    GatewayReplica,
    fleet_policy,
    gateway_replicas,
    new_replica,
    start_backend,
    wait_ready,
)
from tests.kit.redis_server import RedisServer, free_port
from tests.kit.stack import Keys, make_keys

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "fleet_routing.json"
# The shared data folder beside the checkout (or beside the folder of worktrees).
TRACE = (
    next(
        (p for p in (ROOT.parent / "shared", ROOT.parents[1] / "shared") if p.is_dir()),
        ROOT.parent / "shared",
    )
    / "data"
    / "mooncake"
    / "conversation_trace.jsonl"
)
WORDS = ("cache", "tenant", "replica", "prefix", "block", "namespace", "gateway", "fleet",
         "model", "token", "route", "hash", "share", "quota", "audit", "verdict")  # fmt: skip


def conversations(path: Path, count: int, turns: int, blocks: int) -> list[list[list[int]]]:
    """The first `count` conversations with at least `turns` requests: each request's block
    ids (at most `blocks`), in trace order. The second block id names a conversation."""
    found: OrderedDict[int, list[list[int]]] = OrderedDict()
    with path.open() as f:
        for line in f:
            ids = json.loads(line)["hash_ids"]
            if len(ids) > 1:
                found.setdefault(ids[1], []).append(ids[:blocks])
    long = [c[:turns] for c in found.values() if len(c) >= turns]
    if len(long) < count:
        raise SystemExit(f"{path} has only {len(long)} conversations of {turns} turns")
    return long[:count]


def text(ids: list[int], words: int) -> str:
    """A prompt whose prefix is shared exactly as far as the block ids agree."""
    return " ".join(
        f"[{h}] " + " ".join(WORDS[(h * 7 + i * 3) % len(WORDS)] for i in range(words)) for h in ids
    )


@dataclasses.dataclass
class Tally:
    requests: int = 0
    failed: int = 0
    prompt: int = 0
    cached: int = 0
    completion: int = 0
    by_backend: Counter[str] = dataclasses.field(default_factory=Counter)


async def replay(
    url: str, keys: Keys, convs: list[list[list[int]]], run: str, args: argparse.Namespace
) -> dict[str, Any]:
    tally, gate = Tally(), asyncio.Semaphore(args.concurrency)
    headers = {"authorization": f"Bearer {keys.api_keys['acme']}"}

    async def conversation(http: aiohttp.ClientSession, index: int, turns: list[list[int]]) -> None:
        async with gate:
            for ids in turns:  # each turn after the previous one answered, as a chat goes
                message = {"role": "user", "content": text(ids, args.words)}
                body = {"model": "smollm2", "max_tokens": args.max_tokens, "temperature": 0,
                        "user": f"{run}-{index}", "messages": [message]}  # fmt: skip
                async with http.post(url + "/v1/chat/completions", json=body) as resp:
                    answer = await resp.json()
                tally.requests += 1
                if resp.status != 200:
                    tally.failed += 1
                    continue
                usage = answer["usage"]
                tally.prompt += usage["prompt_tokens"]
                tally.cached += usage["prompt_tokens_details"]["cached_tokens"]
                tally.completion += usage["completion_tokens"]

    start = time.perf_counter()
    async with aiohttp.ClientSession(headers=headers) as http:
        await asyncio.gather(*(conversation(http, i, c) for i, c in enumerate(convs)))
    wall = time.perf_counter() - start
    return rates({"requests": tally.requests, "failed": tally.failed, "prompt_tokens": tally.prompt,
                  "cached_tokens": tally.cached, "completion_tokens": tally.completion,
                  "wall_s": round(wall, 2)})  # fmt: skip


def rates(sums: dict[str, Any]) -> dict[str, Any]:
    """`sums` with the hit rate and per-second figures it implies."""
    wall, prompt, cached = sums["wall_s"], sums["prompt_tokens"], sums["cached_tokens"]
    return sums | {
        "hit_rate": round(cached / max(1, prompt), 4),
        "requests_per_s": round(sums["requests"] / wall, 3),
        "prompt_tokens_per_s": round(prompt / wall, 1),
        "computed_prompt_tokens_per_s": round((prompt - cached) / wall, 1),
        "completion_tokens_per_s": round(sums["completion_tokens"] / wall, 2),
    }


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("requests", "failed", "prompt_tokens", "cached_tokens", "completion_tokens", "wall_s")
    sums: dict[str, Any] = {k: sum(r[k] for r in runs) for k in keys}
    sums["wall_s"] = round(sums["wall_s"], 2)
    by_backend: Counter[str] = sum((Counter(r["by_backend"]) for r in runs), Counter())
    return rates(sums) | {"by_backend": dict(by_backend), "runs": runs}


async def agreement(replicas: list[GatewayReplica], rounds: int) -> dict[str, Any]:
    """Write a quarantine (then a release) to the shared state as another replica would, and
    time until every replica's /status shows it."""
    policy = load_policy(replicas[0].policy)
    assert policy.gateway.shared is not None
    store = SharedStore(policy.gateway.shared, policy, FleetMetrics(Metrics()))
    board = SharedHealthBoard(replicas[0].policy.with_name("unused.json"), store)
    samples: list[float] = []
    try:
        async with aiohttp.ClientSession() as http:
            for i in range(rounds):
                quarantined = i % 2 == 0
                start = time.perf_counter()
                await board.update(
                    "backend-b", lambda h, q=quarantined: dataclasses.replace(h, quarantined=q)
                )
                pending = set(range(len(replicas)))
                while pending:
                    for r in list(pending):
                        async with http.get(replicas[r].admin + "/status") as resp:
                            state = (await resp.json())["backends"]["backend-b"]["quarantined"]
                        if state is quarantined:
                            pending.discard(r)
                    await asyncio.sleep(0.005)
                samples.append(time.perf_counter() - start)
            await board.update("backend-b", lambda h: Health())
    finally:
        await store.close()
    ms = sorted(s * 1000 for s in samples)
    return {
        "rounds": rounds,
        "refresh_s": REFRESH_S,
        "median_ms": round(statistics.median(ms), 1),
        "max_ms": round(ms[-1], 1),
        "samples_ms": [round(x, 1) for x in ms],
    }


def _table(results: dict[str, Any]) -> str:
    rows = [("strategy", "requests", "hit rate", "prompt tok/s", "computed tok/s", "req/s",
             "by backend")]  # fmt: skip
    for name in ("affinity", "round_robin"):
        r = results[name]
        rows.append((name, str(r["requests"]), f"{r['hit_rate']:.1%}",
                     f"{r['prompt_tokens_per_s']:.0f}", f"{r['computed_prompt_tokens_per_s']:.0f}",
                     f"{r['requests_per_s']:.2f}", json.dumps(r["by_backend"])))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    q = results["quarantine_agreement"]
    lines.append(
        f"quarantine agreement over {q['rounds']} changes: median {q['median_ms']} ms, "
        f"max {q['max_ms']} ms (refresh every {q['refresh_s']} s)"
    )
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> None:
    host = describe()
    convs = conversations(args.trace, args.conversations, args.turns, args.blocks)
    with tempfile.TemporaryDirectory(prefix="kvfence-fleet-bench-") as tmp:
        folder = Path(tmp)
        keys = make_keys(folder)
        (folder / "redis").mkdir()
        redis = RedisServer(folder / "redis")
        backends = [Backend("backend-a", free_port()), Backend("backend-b", free_port())]
        with contextlib.ExitStack() as stack:
            redis.start()
            stack.callback(redis.stop)
            for backend in backends:
                start_backend(backend, keys, blocks=args.kv_blocks, threads=args.threads)
                stack.callback(backend.stop)
            await asyncio.to_thread(wait_ready, backends)
            affine = [new_replica(folder), new_replica(folder)]
            spread = new_replica(folder)
            for replica in affine:
                fleet_policy(keys, replica, backends, redis.url, tenants="limits: {}")
            fleet_policy(keys, spread, backends, redis.url, strategy="round_robin",
                         tenants="limits: {}")  # fmt: skip
            results: dict[str, Any] = {
                "host": host,
                "workload": vars(args) | {"trace": str(args.trace)},
            }
            with gateway_replicas([*affine, spread]):
                await replay(spread.url, keys, convs[:4], "warm-up", args)  # both backends
                order = [("affinity", affine[0]), ("round_robin", spread)]
                runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in order}
                for turn in range(args.repeats):  # alternating which goes first
                    for name, replica in order if turn % 2 == 0 else order[::-1]:
                        before = replica.served("acme")
                        run = await replay(replica.url, keys, convs, f"{name}-{turn}", args)
                        run["by_backend"] = dict(replica.served("acme") - before)
                        runs[name].append(run)
                for name, found in runs.items():
                    results[name] = combine(found)
                results["quarantine_agreement"] = await agreement(affine, args.agreement_rounds)
    print(_table(results))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4, help="requests per conversation")
    parser.add_argument("--blocks", type=int, default=6, help="trace blocks kept per request")
    parser.add_argument("--words", type=int, default=24, help="words per trace block")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4, help="conversations at once")
    parser.add_argument("--kv-blocks", type=int, default=512, help="each backend's KV pool")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per backend")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each strategy")
    parser.add_argument("--agreement-rounds", type=int, default=20)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
