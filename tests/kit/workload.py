"""A randomized, honest multi-tenant workload for the verification tests and benchmark: tenants
with their own system prompts, multi-turn conversations that send the model's answers back,
exact repeats, the same text sent by two tenants, users and sessions, streamed and not.

Honest means no request ever tries to reach another namespace: every verdict it gets must be
clean of violations. Seeded, so a failure replays. With it, the gateway policy it runs under
(in front of a real vLLM) and its tenants' keys.
"""

from __future__ import annotations

import asyncio
import random
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from kvfence.keys.apikey import key_digest, mint_key
from tests.kit.vllm_server import MODEL_DIR, SERVED_MODEL

PEPPER = "honest-pepper-0123456789"
ENV = {"NS_KEY": "honest-namespace-key-0123456789abcdef", "PEPPER": PEPPER}
SCOPES = {"acme": "tenant", "globex": "tenant", "initech": "user", "umbrella": "session"}


def policy(
    vllm: str,
    state: Path,
    port: int,
    admin: int,
    max_age: int,
    *,
    detective: str = f"{{tokenizer: {MODEL_DIR}, block_size: 128}}",
    history: str = "",
    canary: str = "{interval_s: 3600, prompt_tokens: 300}",
) -> str:
    tenants = "".join(
        f'\n  - {{id: {t}, api_keys: ["{key_digest(PEPPER.encode(), KEYS[t])}"], '
        f"scope: {scope}, models: [{SERVED_MODEL}]}}"
        for t, scope in SCOPES.items()
    )
    return (
        textwrap.dedent(f"""\
        version: 1
        gateway:
          listen: {{host: 127.0.0.1, port: {port}}}
          admin: {{host: 127.0.0.1, port: {admin}}}
          state_dir: {state}
          history: {{block_max_age_s: {max_age}{", " + history if history else ""}}}
          namespace_keys: [{{id: ns1, secret: {{env: NS_KEY}}, active: true}}]
          api_key_pepper: {{env: PEPPER}}
          timeouts: {{connect_s: 5, first_byte_s: 300, idle_s: 120}}
          access_log: false
        backends:
          - name: vllm
            kind: vllm
            url: {vllm}
            verify:
              canary: {canary}
              detective: {detective}
            models: [{{name: {SERVED_MODEL}, revision: "1"}}]
        tenants:""")
        + tenants
        + "\n"
    )


KEYS = {t: mint_key() for t in SCOPES}

WORDS = (
    "parcel",
    "pallet",
    "customs",
    "refund",
    "invoice",
    "carrier",
    "route",
    "depot",
    "freight",
    "label",
    "weight",
    "volume",
    "delivery",
    "window",
    "address",
    "insurance",
    "claim",
    "tariff",
    "export",
    "import",
    "broker",
    "warehouse",
    "pickup",
    "tracking",
    "scanner",
    "manifest",
    "container",
    "vessel",
    "truck",
    "driver",
    "dispatch",
    "schedule",
    "delay",
    "damage",
)


@dataclass
class Tenant:
    id: str
    key: str
    scope: str  # tenant | user | session
    system: str


@dataclass
class Tally:
    verdicts: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    cached: int = 0  # requests that reported a cache hit
    requests: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # "status code" of each refusal


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


class Workload:
    def __init__(self, tenants: list[Tenant], model: str, seed: int) -> None:
        self.tenants, self.model, self.rng = tenants, model, random.Random(seed)
        self.history: list[tuple[Tenant, dict[str, Any], dict[str, str]]] = []

    def _scope(self, tenant: Tenant) -> tuple[dict[str, Any], dict[str, str]]:
        if tenant.scope == "user":
            return {"user": f"user-{self.rng.randrange(3)}"}, {}
        if tenant.scope == "session":
            return {"prompt_cache_key": f"session-{self.rng.randrange(4)}"}, {}
        return {}, {}

    def next(self) -> tuple[Tenant, dict[str, Any], dict[str, str]]:
        """The next request: a repeat, another tenant's text, or a new conversation turn."""
        roll = self.rng.random()
        if self.history and roll < 0.15:
            return self.rng.choice(self.history)  # an exact repeat by the same tenant
        tenant = self.rng.choice(self.tenants)
        if self.history and roll < 0.25:  # the same text from another tenant (a coincidence)
            _, body, _ = self.rng.choice(self.history)
            fields, headers = self._scope(tenant)
            messages = [{"role": "system", "content": tenant.system}, *body["messages"][1:]]
            return tenant, {**body, **fields, "messages": messages}, headers
        fields, headers = self._scope(tenant)
        question = sentence(self.rng, self.rng.randrange(20, 160))
        messages = [
            {"role": "system", "content": tenant.system},
            {"role": "user", "content": question},
        ]
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": 0,
            "max_tokens": self.rng.randrange(1, 9),
            "stream": self.rng.random() < 0.5,
            **fields,
        }
        return tenant, body, headers

    def answered(
        self, tenant: Tenant, body: dict[str, Any], headers: dict[str, str], text: str
    ) -> None:
        """Remember the exchange; sometimes continue the conversation with the answer."""
        self.history.append((tenant, body, headers))
        if text and self.rng.random() < 0.5 and len(body["messages"]) < 9:
            more = sentence(self.rng, self.rng.randrange(5, 40))
            follow = [
                *body["messages"],
                {"role": "assistant", "content": text},
                {"role": "user", "content": more},
            ]
            self.history.append((tenant, {**body, "messages": follow}, headers))


async def send(
    http: aiohttp.ClientSession,
    url: str,
    tenant: Tenant,
    body: dict[str, Any],
    headers: dict[str, str],
) -> tuple[int, str, str, int]:
    """(status, verdict, answer text or the error's code, cached tokens) of one request."""
    all_headers = {"authorization": f"Bearer {tenant.key}", **headers}
    if body.get("stream"):
        body = {**body, "stream_options": {"include_usage": True}}
    async with http.post(url + "/v1/chat/completions", json=body, headers=all_headers) as resp:
        verdict = resp.headers.get("x-kvfence-verdict", "-")
        if resp.status != 200:
            raw = await resp.read()
            try:
                code = str(orjson.loads(raw)["error"]["code"])
            except (orjson.JSONDecodeError, KeyError, TypeError):
                code = raw[:80].decode(errors="replace")
            return resp.status, verdict, code, 0
        if not body.get("stream"):
            doc = await resp.json()
            usage = doc.get("usage") or {}
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            return 200, verdict, doc["choices"][0]["message"]["content"] or "", cached
        text, cached = [], 0
        async for line in resp.content:
            if line.startswith(b"data: {"):
                chunk = orjson.loads(line[6:])
                for choice in chunk.get("choices") or []:
                    text.append((choice.get("delta") or {}).get("content") or "")
                usage = chunk.get("usage") or {}
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or cached
            elif line.startswith(b"event: error"):
                verdict = "stream-error"
        return 200, verdict, "".join(text), cached


async def run(workload: Workload, url: str, requests: int, concurrency: int = 8) -> Tally:
    tally = Tally()
    lock = asyncio.Lock()

    async def one(http: aiohttp.ClientSession) -> None:
        while True:
            async with lock:
                if tally.requests >= requests:
                    return
                tally.requests += 1
                tenant, body, headers = workload.next()
            status, verdict, text, cached = await send(http, url, tenant, body, headers)
            tally.statuses[status] += 1
            tally.verdicts[verdict] += 1
            tally.cached += cached > 0
            if status == 200:
                workload.answered(tenant, body, headers, text)
            else:
                tally.errors[f"{status} {text}"] += 1

    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        await asyncio.gather(*(one(http) for _ in range(concurrency)))
    return tally
