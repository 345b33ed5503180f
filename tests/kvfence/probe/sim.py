"""A simulated inference endpoint with a block prefix cache, for running the probe's method
thousands of times where a real server would take hours: first-token time grows with the
uncached tokens, plus exponential noise. Each request lands in the cache namespace its scope
gives it (per identity: isolated; one for all: pooled).

`SimEndpoint` is an in-memory `Sender`; `SimServer` serves the same model over real HTTP (an
aiohttp app on port 0, streaming like an OpenAI server) for the command-line tests. Neither
stands in for a server we test against: the real ones are in test_probe_backend / _vllm.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from kvfence.probe.client import Identity, Observation

TEMPLATE = ("<|im_start|>", "system", "You", "are", "a", "helpful", "assistant")


def isolated(identity: Identity) -> str:
    return identity.name


def pooled(identity: Identity) -> str:
    return "everyone"


@dataclass
class SimCache:
    block: int = 16
    template: int = 20  # leading tokens every prompt shares (a chat template's system prompt)
    caching: bool = True
    base_s: float = 0.02
    per_token_s: float = 0.001
    noise_s: float = 0.01  # mean of the exponential noise added to every answer
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    requests: int = 0
    _blocks: dict[str, set[tuple[str, ...]]] = field(default_factory=dict)

    def answer(self, namespace: str, text: str) -> tuple[float, int, int]:
        """(first-token time, cached tokens, prompt tokens) of one request."""
        self.requests += 1
        head = [TEMPLATE[i % len(TEMPLATE)] for i in range(self.template)]
        tokens = head + text.split()
        store = self._blocks.setdefault(namespace, set())
        prefixes = [tuple(tokens[: (i + 1) * self.block]) for i in range(len(tokens) // self.block)]
        cached = 0
        if self.caching:
            for prefix in prefixes:
                if prefix not in store:
                    break
                cached += self.block
            store.update(prefixes)
        ttft = self.base_s + self.per_token_s * (len(tokens) - cached)
        return ttft + self.rng.expovariate(1 / self.noise_s), cached, len(tokens)


@dataclass
class SimEndpoint:
    cache: SimCache = field(default_factory=SimCache)
    scope: Callable[[Identity], str] = isolated
    report: bool = True  # whether answers carry cached_tokens

    async def __call__(self, identity: Identity, text: str) -> Observation:
        ttft, cached, prompt = self.cache.answer(self.scope(identity), text)
        return Observation(ttft, cached if self.report else None, prompt, 1)


def _chunk(choices: list[Any], usage: dict[str, Any] | None = None) -> bytes:
    body: dict[str, Any] = {"object": "chat.completion.chunk", "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return b"data: " + orjson.dumps(body) + b"\n\n"


class SimServer:
    """The simulated cache over HTTP: it scopes by the bearer key (`pooled`: one cache for all),
    sleeps the simulated first-token time, then streams one token and the usage chunk."""

    def __init__(self, cache: SimCache, pooled: bool = False, models: tuple[str, ...] = ("sim",)):
        self.cache, self.pooled, self.models = cache, pooled, models
        self.seen_keys: list[str] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> SimServer:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        key = request.headers.get("authorization", "").removeprefix("Bearer ")
        self.seen_keys.append(key)
        if body.get("model") not in self.models:
            error = {"error": {"message": f"The model `{body.get('model')}` does not exist."}}
            return web.json_response(error, status=404)
        text = body["messages"][0]["content"]
        ttft, cached, prompt = self.cache.answer("all" if self.pooled else key, text)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(ttft)
        await resp.write(_chunk([{"index": 0, "delta": {"content": "x"}}]))
        usage = {"prompt_tokens": prompt, "prompt_tokens_details": {"cached_tokens": cached}}
        await resp.write(_chunk([], usage) + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
