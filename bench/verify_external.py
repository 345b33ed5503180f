"""How fast verification catches a real vLLM behind leaky layers, and that it never quarantines
an honest one. Prints the figures and writes bench/results/verify_external.json. Needs the vLLM
environment (scripts/vllm-env). The same with fakes, at in-process speed: bench/verify_classes.

    .venv/bin/python -m bench.verify_external [--honest 2000] [--workers 2] [--rounds 30]

1. Requests to quarantine per leaky class (tests/fakes/salt_dropping_proxy.py with the rules of
   tests/fakes/leaky_layers.py in front of a real vLLM): tenant A sends a document, B sends the
   same request; tenants' and canaries' requests until the backend is quarantined, and whether
   B was ever served a hit on A's document. A count that lies (always 0) and a count stripped
   away are decided by timing.
2. Honest canary rounds: scheduled rounds (sweeping shapes) against a healthy vLLM.
3. Tenant-crafted requests: the four ways of sending the same tokens, repeated by two tenants.
4. False violations: a randomized honest workload (tests/kit/workload.py) through the real
   gateway CLI with several workers, restarted halfway with its state kept.
5. Marker scan: CPU time per streamed event of `AnswerScan.events`, in process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson

from bench.machine import describe
from gateway.verify.markers import MarkerKey
from gateway.verify.scan import AnswerScan
from gateway.verify.tokens import ChatTokenizer
from tests.fakes import leaky_layers as layers
from tests.fakes.salt_dropping_proxy import RewritingProxy
from tests.kit.gateway_process import gateway_process
from tests.kit.leak_scenarios import (
    Make,
    canary_requests,
    chat,
    completions,
    read,
    until_quarantined,
)
from tests.kit.polling import until
from tests.kit.verified_gateway import policy_text, verified_gateway
from tests.kit.vllm_server import MODEL_DIR, SERVED_MODEL, free_port, running_vllm
from tests.kit.workload import ENV, KEYS, SCOPES, Tenant, Workload, policy, run, sentence

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "verify_external.json"

# vLLM's CPU backend dies on a seeded prompt long enough for a chunked prefill ("CPU Generator
# does not use offset"): that class sends short documents.
SHORT = {"by a sampling field (seed)"}
CLASSES: dict[str, tuple[Any, Make, dict[str, bool]]] = {  # layer rule, traffic, proxy options
    "drops the salt always": (None, chat(), {}),
    "by body size (> 3 kB)": (layers.by_size(3000), chat(), {}),
    "by path (completions)": (layers.by_path("/v1/completions"), completions(), {}),
    "by streaming": (layers.by_stream, chat(stream=True), {}),
    "by message count (>= 3)": (layers.by_messages(3), chat(messages=4), {}),
    "by a sampling field (seed)": (layers.by_field("seed"), chat(seed=7), {}),
    "drops the salt, count says 0": (None, chat(), {"zero_cached": True}),
    "drops the salt, no usage": (None, chat(), {"strip_usage": True}),
}


async def leaky(vllm: str, tmp: Path, name: str, seed: int) -> dict[str, Any]:
    when, make, options = CLASSES[name]
    async with (
        RewritingProxy(vllm, when=when, **options) as proxy,
        verified_gateway(policy_text(proxy.url, tmp)) as gw,
    ):
        await until(lambda: gw.health().rounds >= 1, timeout_s=900, what="the first round")
        words = 100 if name in SHORT else 700
        tally = await until_quarantined(gw, make, pairs=10, rng=random.Random(seed), words=words)
        health = gw.health()
    return {**tally.as_json(), "canary_by": health.canary_by, "reason": health.canary_reason}


async def starts_later(vllm: str, tmp: Path, seed: int) -> dict[str, Any]:
    switch = layers.Switch()
    async with (
        RewritingProxy(vllm, when=switch) as proxy,
        verified_gateway(policy_text(proxy.url, tmp)) as gw,
    ):
        await until(lambda: gw.health().rounds >= 1, timeout_s=300, what="the first round")
        before = gw.health().canary
        switch.on = True
        tally = await until_quarantined(gw, chat(), pairs=10, rng=random.Random(seed))
    return {**tally.as_json(), "canary_before": before}


async def honest_rounds(vllm: str, tmp: Path, rounds: int) -> dict[str, Any]:
    outcomes: Counter[str] = Counter()
    shapes: Counter[str] = Counter()
    async with verified_gateway(policy_text(vllm, tmp)) as gw:
        await until(lambda: gw.health().rounds >= 1, timeout_s=300, what="the first round")
        outcomes[gw.health().canary] += 1
        for _ in range(rounds - 1):
            health = await gw.round()
            outcomes[health.canary] += 1
            shapes[health.canary_shapes[-1].split("/")[0]] += 1
            if health.quarantined:
                break
        quarantined, sent = gw.health().quarantined, canary_requests(gw)
    return {"rounds": sum(outcomes.values()), "outcomes": dict(outcomes),
            "paths": dict(shapes), "quarantined": quarantined, "canary_requests": sent}  # fmt: skip


async def crafted(vllm: str, tmp: Path, repeats: int) -> dict[str, Any]:
    """Each tenant sends the same tokens in four forms (text parts then one string; a
    completions prompt as text then as ids; a chat then its template as text, and as ids)."""
    tok = ChatTokenizer(MODEL_DIR)
    verdicts: Counter[str] = Counter()
    hits = 0
    async with verified_gateway(policy_text(vllm, tmp)) as gw:
        await until(lambda: gw.health().rounds >= 1, timeout_s=300, what="the first round")
        for _ in range(repeats):
            for tenant in ("acme", "globex"):
                text = " ".join(secrets.token_hex(2) for _ in range(200))
                messages = [{"role": "user", "content": text}]
                rendered = tok.chat_text(messages) or ""
                head, tail = text[: len(text) // 2], text[len(text) // 2 :]
                parts = [{"type": "text", "text": head}, {"type": "text", "text": tail}]
                joined = [{"role": "user", "content": head + "\n" + tail}]
                pairs = [
                    ("/v1/chat/completions", {"messages": [{"role": "user", "content": parts}]}),
                    ("/v1/chat/completions", {"messages": joined}),
                    ("/v1/completions", {"prompt": text}),
                    ("/v1/completions", {"prompt": tok.text_ids(text)}),
                    ("/v1/chat/completions", {"messages": messages}),
                    ("/v1/completions", {"prompt": rendered}),
                    ("/v1/completions", {"prompt": tok.text_ids(rendered, False)}),
                ]  # fmt: skip
                for path, body in pairs:
                    body = {"model": SERVED_MODEL, "max_tokens": 2, **body}
                    status, verdict, cached, _ = await read(await gw.post(tenant, path, body))
                    verdicts[f"{status} {verdict}"] += 1
                    hits += cached > 0
        health = gw.health()
    return {"requests": sum(verdicts.values()), "verdicts": dict(verdicts), "with_hits": hits,
            "quarantined": health.quarantined, "violations": dict(health.violations)}  # fmt: skip


async def honest(vllm: str, tmp: Path, requests: int, workers: int) -> dict[str, Any]:
    rng = Workload([], SERVED_MODEL, 0).rng
    tenants = [Tenant(t, KEYS[t], s, f"You are {t}'s assistant. " + sentence(rng, 60))
               for t, s in SCOPES.items()]  # fmt: skip
    work = Workload(tenants, SERVED_MODEL, seed=11)
    port, admin = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    path = tmp / "honest.yaml"
    path.write_text(policy(vllm, tmp / "state", port, admin, max_age=3600))
    tallies = []
    started = time.perf_counter()
    for half in (requests // 2, requests - requests // 2):
        with gateway_process(path, url, workers=workers, env=ENV):
            tallies.append(await run(work, url, half))
    verdicts: dict[str, int] = {}
    for tally in tallies:
        for verdict, count in tally.verdicts.items():
            verdicts[verdict] = verdicts.get(verdict, 0) + count
    health = orjson.loads((tmp / "state" / "health.json").read_bytes())["vllm"]
    return {
        "requests": requests,
        "workers": workers,
        "seconds": round(time.perf_counter() - started, 1),
        "verdicts": verdicts,
        "with_cache_hits": sum(t.cached for t in tallies),
        "non_200": sum(n for t in tallies for s, n in t.statuses.items() if s != 200),
        "quarantined": health["quarantined"],
        "rounds": health["rounds"],
        "violations": health["violations"],
    }


def scan_cost(events: int = 20000) -> dict[str, float]:
    key = MarkerKey(b"k" * 32)
    chunk = {"id": "x", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"content": " word"}, "finish_reason": None}]}  # fmt: skip
    event = b"data: " + orjson.dumps(chunk) + b"\n\n"
    scan = AnswerScan(key, "/v1/chat/completions")
    started = time.process_time()
    for _ in range(events):
        scan.events(event)
    per_event = (time.process_time() - started) / events
    return {"us_per_streamed_event": round(per_event * 1e6, 2), "events": events}


async def main(args: argparse.Namespace) -> None:
    result: dict[str, Any] = {"host": describe(), "marker_scan": scan_cost(), "leaky": {}}
    print("marker scan:", result["marker_scan"])
    with tempfile.TemporaryDirectory() as tmp, running_vllm() as vllm:
        base = Path(tmp)
        for i, name in enumerate(CLASSES):
            result["leaky"][name] = await leaky(vllm, base / f"leak{i}", name, i)
            print(f"{name}: {json.dumps(result['leaky'][name])}")
        result["leaky"]["starts after the last round"] = await starts_later(vllm, base / "sw", 9)
        print("starts after the last round:", result["leaky"]["starts after the last round"])
        result["honest_rounds"] = await honest_rounds(vllm, base / "rounds", args.rounds)
        print("honest rounds:", json.dumps(result["honest_rounds"]))
        result["crafted"] = await crafted(vllm, base / "crafted", args.crafted)
        print("tenant-crafted same-token requests:", json.dumps(result["crafted"]))
        result["honest"] = await honest(vllm, base, args.honest, args.workers)
        print("honest traffic:", json.dumps(result["honest"], indent=1))
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--honest", type=int, default=2000, help="honest requests")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=30, help="scheduled rounds, healthy vLLM")
    parser.add_argument("--crafted", type=int, default=5, help="repeats of the crafted forms")
    asyncio.run(main(parser.parse_args()))
