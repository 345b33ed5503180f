"""How fast verification catches a server that drops `cache_salt`, how often it is wrong on
honest traffic, and what the marker scan costs. Prints the figures and writes
bench/results/verify_external.json. Needs the vLLM environment (scripts/vllm-env).

    .venv/bin/python -m bench.verify_external [--honest 2000] [--workers 2]

1. Requests to flag the salt-dropping proxy (tests/fakes/salt_dropping_proxy.py in front of a
   real vLLM): by a canary round with cached tokens, by a canary round on timing alone (usage
   stripped), and by the detective audit (tenant A primes, tenant B sends the same prompt).
2. False violations: a randomized honest workload (tests/kit/workload.py) through the real
   gateway CLI with several workers, restarted halfway with its state kept.
3. Marker scan: CPU time per streamed event of `AnswerScan.events`, in process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson

from bench.machine import describe
from gateway.verify.markers import MarkerKey
from gateway.verify.scan import AnswerScan
from tests.fakes.salt_dropping_proxy import RewritingProxy
from tests.kit.gateway_process import gateway_process
from tests.kit.polling import until
from tests.kit.verified_gateway import policy_text, verified_gateway
from tests.kit.vllm_server import SERVED_MODEL, free_port, running_vllm
from tests.kit.workload import ENV, KEYS, SCOPES, Tenant, Workload, policy, run, sentence

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "verify_external.json"


async def flag_counts(vllm: str, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with (
        RewritingProxy(vllm) as proxy,
        verified_gateway(policy_text(proxy.url, tmp / "a")) as gw,
    ):
        await until(lambda: gw.health().rounds >= 1, timeout_s=300)
        before = proxy.forwarded
        out["canary_by_cached_tokens"] = {"outcome": gw.health().canary, "requests": before}
    async with (
        RewritingProxy(vllm, strip_usage=True) as proxy,
        verified_gateway(policy_text(proxy.url, tmp / "b")) as gw,
    ):
        await until(lambda: gw.health().rounds >= 1, timeout_s=600)
        out["canary_by_timing"] = {"outcome": gw.health().canary, "requests": proxy.forwarded}
    text = policy_text("", tmp / "c", canary="false")
    async with (
        RewritingProxy(vllm) as proxy,
        verified_gateway(text.replace("url: \n", f"url: {proxy.url}\n")) as gw,
    ):
        prompt = " ".join(sentence(Workload([], SERVED_MODEL, 1).rng, 5) for _ in range(40))
        await gw.chat("acme", prompt)
        leaked = await gw.chat("globex", prompt)
        out["detective"] = {
            "verdict": leaked.headers.get("x-kvfence-verdict"),
            "requests_after_the_victim": 1,
            "status": leaked.status,
        }
    return out


async def honest(vllm: str, tmp: Path, requests: int, workers: int) -> dict[str, Any]:
    rng = Workload([], SERVED_MODEL, 0).rng
    tenants = [Tenant(t, KEYS[t], s, f"You are {t}'s assistant. " + sentence(rng, 60))
               for t, s in SCOPES.items()]  # fmt: skip
    work = Workload(tenants, SERVED_MODEL, seed=11)
    port, admin = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    path = tmp / "honest.yaml"
    path.write_text(policy(vllm, tmp / "state", port, admin, max_age=0))
    tallies = []
    started = time.perf_counter()
    for half in (requests // 2, requests - requests // 2):
        with gateway_process(path, url, workers=workers, env=ENV):
            tallies.append(await run(work, url, half))
    verdicts: dict[str, int] = {}
    for tally in tallies:
        for verdict, count in tally.verdicts.items():
            verdicts[verdict] = verdicts.get(verdict, 0) + count
    return {
        "requests": requests,
        "workers": workers,
        "seconds": round(time.perf_counter() - started, 1),
        "verdicts": verdicts,
        "with_cache_hits": sum(t.cached for t in tallies),
        "non_200": sum(n for t in tallies for s, n in t.statuses.items() if s != 200),
    }


def scan_cost(events: int = 20000) -> dict[str, float]:
    key = MarkerKey(b"k" * 32)
    chunk = {"id": "x", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"content": " word"}, "finish_reason": None}]}  # fmt: skip
    event = b"data: " + orjson.dumps(chunk) + b"\n\n"
    scan = AnswerScan(key, "/v1/chat/completions", attested=False)
    started = time.process_time()
    for _ in range(events):
        scan.events(event)
    per_event = (time.process_time() - started) / events
    return {"us_per_streamed_event": round(per_event * 1e6, 2), "events": events}


async def main(args: argparse.Namespace) -> None:
    result: dict[str, Any] = {"host": describe(), "marker_scan": scan_cost()}
    print("marker scan:", result["marker_scan"])
    with tempfile.TemporaryDirectory() as tmp, running_vllm() as vllm:
        result["flag"] = await flag_counts(vllm, Path(tmp))
        print("requests to flag the salt-dropping proxy:", json.dumps(result["flag"], indent=1))
        result["honest"] = await honest(vllm, Path(tmp), args.honest, args.workers)
        print("honest traffic:", json.dumps(result["honest"], indent=1))
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--honest", type=int, default=2000, help="honest requests")
    parser.add_argument("--workers", type=int, default=2)
    asyncio.run(main(parser.parse_args()))
