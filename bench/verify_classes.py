"""Verification against leaky layers and honest servers, all fakes, at in-process speed: how
many requests (tenants' and canaries') each leaky class takes to be quarantined and whether B
was ever served a hit on A's document; how many rounds and requests honest but awkward servers
(slow, jittery, restarting, disaggregated prefill, caching nothing) run without a false
quarantine; the timing mode's false-`shared` count over many simulated jittery rounds and the
requests it takes on a sharing server whose count lies; and a long honest run. Prints the
figures and writes bench/results/verify_classes.json. The real-vLLM figures:
bench/verify_external.py.

    .venv/bin/python -m bench.verify_classes [--repeat 5] [--null-rounds 10000] [--honest 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import describe
from gateway.app import create_app
from gateway.policy.backend_model import CanarySettings
from gateway.policy.load import parse_policy
from gateway.server import bound_port, start
from gateway.verify.service import VERIFY
from gateway.verify.shapes import Shape
from gateway.verify.timing import config, most_requests
from gateway.verify.watch import WATCH
from kvfence.probe.client import Identity
from kvfence.probe.method import run_probe
from kvfence.probe.outcome import Outcome
from kvfence.probe.prompts import PromptFactory
from tests.fakes import leaky_layers as layers
from tests.fakes.cache_server import CacheServer
from tests.kit.leak_scenarios import (
    Make,
    canary_requests,
    chat,
    completions,
    document,
    leaky_gateway,
    never,
    read,
    until_quarantined,
)
from tests.kit.polling import until
from tests.kit.simulated_timing import SimulatedServer
from tests.kit.vllm_server import SERVED_MODEL
from tests.kit.workload import ENV, KEYS, SCOPES, Tenant, Workload, policy, run, sentence

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "verify_classes.json"

PARTIAL: dict[str, tuple[Any, Make, dict[str, Any], bool]] = {  # layer, traffic, server, zero
    "drops the salt always": (None, chat(), {}, False),
    "by body size": (layers.by_size(2500), chat(), {}, False),
    "by path (completions)": (layers.by_path("/v1/completions"), completions(), {}, False),
    "by streaming": (layers.by_stream, chat(stream=True), {}, False),
    "by message count": (layers.by_messages(3), chat(messages=4), {}, False),
    "by a sampling field": (layers.by_field("seed"), chat(seed=7), {}, False),
    "offload tier without the salt": (never, chat(), {"host": "unsalted"}, False),
    "MAX Serve without its salt flag": (never, chat(), {"honours_salt": False}, False),
    "drops the salt, count says 0": (None, chat(), {}, True),
}


async def leaky_class(name: str, tmp: Path, seed: int) -> dict[str, Any]:
    when, make, server, zero = PARTIAL[name]
    kind = "max" if "MAX" in name else "sglang" if "tier" in name else "vllm"
    async with leaky_gateway(tmp, when, server, zero=zero, kind=kind) as (gw, _):
        tally = await until_quarantined(gw, make, pairs=20, rng=random.Random(seed), words=600)
    return tally.as_json()


async def starts_later(tmp: Path, seed: int) -> dict[str, Any]:
    switch = layers.Switch()
    async with leaky_gateway(tmp, switch) as (gw, _):
        before = gw.health().canary
        switch.on = True
        tally = await until_quarantined(gw, chat(), pairs=20, rng=random.Random(seed))
    return {**tally.as_json(), "canary_before": before}


async def partial_and_lying(tmp: Path) -> dict[str, Any]:
    async with leaky_gateway(tmp, layers.by_size(1200), zero=True) as (gw, _):
        rounds = 1
        while not gw.health().quarantined and rounds < 40:
            await gw.round()
            rounds += 1
        return {"quarantined": gw.health().quarantined, "rounds": rounds,
                "canary_requests": canary_requests(gw)}  # fmt: skip


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    counts = [r["requests_to_quarantine"] for r in runs]
    return {"runs": len(runs), "all_quarantined": all(r["quarantined"] for r in runs),
            "served_cross_hits": sum(r["served_cross_hits"] for r in runs),
            "requests_to_quarantine": {"min": min(counts), "median": statistics.median(counts),
                                       "max": max(counts)}}  # fmt: skip


HONEST: dict[str, dict[str, Any]] = {
    "slow (sends time out)": {"jitter_s": 0.05, "first_byte_s": 0.05},
    "jittery, no count (timing)": {"counter": "none", "jitter_s": 0.003, "token_s": 0.0004},
    "restarting": {"restart": True},
    "disaggregated prefill counts": {"counter": "pd"},
    "caches nothing (hybrid)": {"caching": False},
}


async def honest_server(name: str, tmp: Path, rounds: int) -> dict[str, Any]:
    opts = dict(HONEST[name])
    first_byte = opts.pop("first_byte_s", 30)
    restart = opts.pop("restart", False)
    outcomes: Counter[str] = Counter()
    tenant = {"requests": 0, "violations": 0}
    async with leaky_gateway(tmp, never, opts, first_byte_s=first_byte) as (gw, fake):
        outcomes[gw.health().canary] += 1
        rng = random.Random(1)
        for _ in range(rounds - 1):
            if restart:
                fake.down(0.2)
            path, body = chat()(document(rng, 100))
            for who in ("acme", "globex", "globex"):  # B repeats A's prompt: the same tokens
                _, verdict, _, _ = await read(await gw.post(who, path, body))
                tenant["requests"] += 1
                tenant["violations"] += verdict == "violation"
            outcomes[(await gw.round()).canary] += 1
        health, sent = gw.health(), canary_requests(gw)
    return {"rounds": rounds, "outcomes": dict(outcomes), "quarantined": health.quarantined,
            "canary_requests": sent, "tenant": tenant}  # fmt: skip


async def timing_null(rounds: int) -> dict[str, Any]:
    settings, shape = CanarySettings(), Shape("/v1/chat/completions", True, 1, 64)
    a, b = Identity("A"), Identity("B")
    outcomes: Counter[str] = Counter()
    requests = []
    started = time.perf_counter()
    for seed in range(rounds):
        server = SimulatedServer(seed)
        probe = await run_probe(server.send, a, b, config(settings, shape),
                                prompts=PromptFactory(64, random.Random(seed)),
                                rng=random.Random(seed))  # fmt: skip
        outcomes[probe.decision.outcome.value] += 1
        requests.append(server.requests)
    sharing = []
    for seed in range(200):
        server = SimulatedServer(seed, shared=True)
        probe = await run_probe(server.send, a, b, config(settings, shape),
                                prompts=PromptFactory(64, random.Random(seed)),
                                rng=random.Random(seed))  # fmt: skip
        sharing.append((probe.decision.outcome is Outcome.SHARED, server.requests))
    found = [n for shared, n in sharing if shared]
    return {
        "healthy_rounds": rounds, "healthy_outcomes": dict(outcomes),
        "false_shared": outcomes["shared"], "stated_rate_per_round": settings.timing_alpha,
        "most_requests_per_round": most_requests(settings),
        "healthy_requests": {"min": min(requests), "max": max(requests)},
        "sharing_rounds": len(sharing), "sharing_found": len(found),
        "sharing_requests": {"min": min(found), "median": statistics.median(found),
                             "max": max(found)} if found else None,
        "seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip


async def honest_run(tmp: Path, requests: int) -> dict[str, Any]:
    rng = Workload([], SERVED_MODEL, 0).rng
    preamble = "Company rules for every assistant: be brief, be exact, never guess. " * 3
    tenants = [Tenant(t, KEYS[t], s, f"{preamble}You are {t}'s assistant. {sentence(rng, 30)}")
               for t, s in SCOPES.items()]  # fmt: skip
    work = Workload(tenants, SERVED_MODEL, seed=31)
    fake = CacheServer(device_blocks=600)
    await fake.start()
    text = policy(fake.url, tmp / "honest", 0, 0, 3600, detective="{block_size: 16}",
                  history="capacity: 4096, tenant_cap: 512",
                  canary="{interval_s: 3600, prompt_tokens: 64}")  # fmt: skip
    verdicts: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    started, restarts = time.perf_counter(), 5
    try:
        for _ in range(restarts):
            app = create_app(parse_policy(text, "honest.yaml", env=ENV))
            runner = await start(app, "127.0.0.1", 0)
            try:
                await until(lambda app=app: app[VERIFY].health.get("vllm").rounds >= 1)
                tally = await run(work, f"http://127.0.0.1:{bound_port(runner)}",
                                  requests // restarts)  # fmt: skip
                await app[WATCH].idle()
                verdicts.update(tally.verdicts)
                statuses.update(tally.statuses)
                health = app[VERIFY].health.get("vllm")
            finally:
                await runner.cleanup()
    finally:
        await fake.close()
    return {"requests": sum(statuses.values()), "restarts": restarts - 1,
            "verdicts": dict(verdicts), "statuses": {str(k): v for k, v in statuses.items()},
            "quarantined": health.quarantined, "violations": dict(health.violations),
            "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip


async def main(args: argparse.Namespace) -> None:
    result: dict[str, Any] = {"host": describe(), "leaky": {}, "honest_servers": {}}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        for name in PARTIAL:
            runs = [await leaky_class(name, base / f"{name}-{i}", i) for i in range(args.repeat)]
            result["leaky"][name] = summary(runs)
            print(f"{name}: {json.dumps(result['leaky'][name])}")
        later = [await starts_later(base / f"later-{i}", i) for i in range(args.repeat)]
        result["leaky"]["starts after the last round"] = summary(later)
        print("starts after the last round:", json.dumps(summary(later)))
        result["leaky"]["by body size, count says 0"] = await partial_and_lying(base / "pl")
        print("by body size, count says 0:", result["leaky"]["by body size, count says 0"])
        for name in HONEST:
            result["honest_servers"][name] = await honest_server(name, base / name, args.rounds)
            print(f"honest, {name}: {json.dumps(result['honest_servers'][name])}")
        result["timing"] = await timing_null(args.null_rounds)
        print("timing mode:", json.dumps(result["timing"]))
        result["honest_run"] = await honest_run(base, args.honest)
        print("honest run:", json.dumps(result["honest_run"]))
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per leaky class")
    parser.add_argument("--rounds", type=int, default=30, help="rounds per honest server")
    parser.add_argument("--null-rounds", type=int, default=10000, help="simulated timing rounds")
    parser.add_argument("--honest", type=int, default=10000, help="honest requests")
    asyncio.run(main(parser.parse_args()))
