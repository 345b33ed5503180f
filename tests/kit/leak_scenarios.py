"""Two tenants against a verifying gateway in front of a leaky layer: tenant A sends a document,
tenant B sends the same request (what an attacker probing A's prefixes sends), pair after pair,
until the backend is quarantined; what B was served and how many requests (tenants' and
canaries') it took. The verification tests and bench/verify_classes.py both run it.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from gateway.metrics import METRICS
from gateway.verify.watch import WATCH
from tests.fakes.cache_server import CacheServer
from tests.fakes.salt_dropping_proxy import RewritingProxy, When
from tests.kit.polling import until
from tests.kit.verified_gateway import Verified, policy_text, verified_gateway
from tests.kit.vllm_server import SERVED_MODEL

Make = Callable[[str], tuple[str, dict[str, Any]]]  # document text -> (path, body)


@dataclass
class Tally:
    tenant_requests: int = 0
    canary_requests: int = 0
    served_hits: int = 0  # B's answers that reached B reporting a hit on A's document
    withheld: int = 0  # B's answers withheld (502, or a stream cut before its usage)
    verdicts: Counter[str] = field(default_factory=Counter)
    quarantined: bool = False

    @property
    def requests(self) -> int:
        return self.tenant_requests + self.canary_requests

    def as_json(self) -> dict[str, Any]:
        return {"quarantined": self.quarantined, "requests_to_quarantine": self.requests,
                "tenant_requests": self.tenant_requests, "canary_requests": self.canary_requests,
                "served_cross_hits": self.served_hits, "withheld": self.withheld,
                "verdicts": dict(self.verdicts)}  # fmt: skip


def document(rng: random.Random, words: int) -> str:
    """Fresh text no cache holds (about one token per word)."""
    return " ".join(f"{rng.getrandbits(16):04x}" for _ in range(words))


def chat(stream: bool = False, messages: int = 1, **extra: Any) -> Make:
    def make(text: str) -> tuple[str, dict[str, Any]]:
        words = text.split()
        step = -(-len(words) // messages)
        parts = [" ".join(words[i : i + step]) for i in range(0, len(words), step)]
        turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": p}
                 for i, p in enumerate(parts)]  # fmt: skip
        turns[-1]["role"] = "user"
        return "/v1/chat/completions", {"model": SERVED_MODEL, "messages": turns,
                                        "max_tokens": 2, "stream": stream, **_usage(stream),
                                        **extra}  # fmt: skip

    return make


def completions(stream: bool = False, **extra: Any) -> Make:
    def make(text: str) -> tuple[str, dict[str, Any]]:
        return "/v1/completions", {"model": SERVED_MODEL, "prompt": text, "max_tokens": 2,
                                   "stream": stream, **_usage(stream), **extra}  # fmt: skip

    return make


def responses(stream: bool = False) -> Make:
    def make(text: str) -> tuple[str, dict[str, Any]]:
        return "/v1/responses", {"model": SERVED_MODEL, "input": text, "max_output_tokens": 2,
                                 "stream": stream}  # fmt: skip

    return make


def _usage(stream: bool) -> dict[str, Any]:
    return {"stream_options": {"include_usage": True}} if stream else {}


async def read(resp: aiohttp.ClientResponse) -> tuple[int, str, int, bool]:
    """(status, verdict, cached tokens the client was shown, cut short)."""
    verdict = resp.headers.get("x-kvfence-verdict", "-")
    raw = await resp.read()
    if resp.status != 200:
        return resp.status, verdict, 0, True
    if not resp.headers.get("content-type", "").startswith("text/event-stream"):
        usage = orjson.loads(raw).get("usage") or {}
        return 200, verdict, _cached(usage), False
    cached, cut = 0, b"event: error" in raw or b"[DONE]" not in raw
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            usage = orjson.loads(line[6:]).get("usage") or {}
            cached = _cached(usage) or cached
    return 200, verdict, cached, cut


def _cached(usage: dict[str, Any]) -> int:
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def canary_requests(gw: Verified) -> int:
    totals = gw.app[METRICS].totals("kvfence_gateway_canary_requests")
    return int(sum(value for _, value in totals))


async def until_quarantined(
    gw: Verified, make: Make, pairs: int, rng: random.Random, words: int = 300
) -> Tally:
    """A's request then B's copy of it, `pairs` times or until the backend is quarantined
    (each pair waits for the rounds it triggered). Canary requests count from the gateway's
    start: the first round may be the one that finds the layer."""
    tally = Tally()
    for _ in range(pairs):
        if gw.health().quarantined:
            break
        path, body = make(document(rng, words))
        for tenant in ("acme", "globex"):
            status, verdict, cached, cut = await read(await gw.post(tenant, path, body))
            tally.tenant_requests += 1
            tally.verdicts[verdict] += 1
            if tenant == "globex":
                tally.served_hits += status == 200 and not cut and cached > 0
                tally.withheld += cut
        await gw.app[WATCH].idle()
    tally.canary_requests = canary_requests(gw)
    tally.quarantined = gw.health().quarantined
    return tally


def never(path: str, body: dict[str, Any]) -> bool:
    """A layer that keeps the scope."""
    return False


@asynccontextmanager
async def leaky_gateway(
    tmp: Path,
    when: When | None,
    server: dict[str, Any] | None = None,
    *,
    zero: bool = False,
    kind: str = "vllm",
    canary: str = "{interval_s: 3600, prompt_tokens: 64}",
    first_byte_s: float = 30,
) -> AsyncIterator[tuple[Verified, CacheServer]]:
    """A verifying gateway (bound mode) in front of `RewritingProxy(when=...)` in front of a
    fake server, once its first canary round ended."""
    fake = CacheServer(**(server or {}))
    await fake.start()
    try:
        async with RewritingProxy(fake.url, when=when, zero_cached=zero) as proxy:
            text = policy_text(proxy.url, tmp, canary=canary, detective="{block_size: 16}",
                               kind=kind, first_byte_s=first_byte_s)  # fmt: skip
            async with verified_gateway(text) as gw:
                await until(lambda: gw.health().rounds >= 1, timeout_s=120, what="the first round")
                yield gw, fake
    finally:
        await fake.close()
