"""Two tenants' sessions at once, as the cross-tenant incident reports recommend testing: each
tenant's prompts carry a secret word of its own; every request is sent once to warm the cache,
then alone, then all of them together (same prompts and different ones, streamed and not), so
the last two runs differ only in batching. Used against our backend and against a real vLLM."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

Post = Callable[[str, dict[str, Any]], Awaitable[aiohttp.ClientResponse]]
TOPICS = ("pallets", "customs forms", "refunds", "parcel tracking", "insurance claims", "depots")


@dataclass(frozen=True)
class Answer:
    tenant: str
    text: str
    verdict: str
    status: int


def requests(
    model: str, secret: dict[str, str], per_tenant: int
) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for tenant, word in secret.items():
        for i in range(per_tenant):
            topic = TOPICS[i % len(TOPICS)]  # the same prompts for both tenants, apart from
            own = (
                f"My code word is {word}. " if i % 2 else ""
            )  # ... their own secret, half the time
            body = {
                "model": model,
                "messages": [{"role": "user", "content": f"{own}Explain {topic} in one line."}],
                "max_tokens": 8,
                "temperature": 0,
                "stream": i % 3 == 0,
            }
            out.append((tenant, body))
    return out


async def answer(post: Post, tenant: str, body: dict[str, Any]) -> Answer:
    resp = await post(tenant, body)
    verdict = resp.headers.get("x-kvfence-verdict", "-")
    if resp.status != 200:
        return Answer(tenant, await resp.text(), verdict, resp.status)
    if not body["stream"]:
        doc = await resp.json()
        return Answer(tenant, doc["choices"][0]["message"]["content"], verdict, 200)
    text = []
    async for line in resp.content:
        if line.startswith(b"data: {"):
            for choice in orjson.loads(line[6:]).get("choices") or []:
                text.append((choice.get("delta") or {}).get("content") or "")
        elif line.startswith(b"event: error"):
            verdict = "stream-error"
    return Answer(tenant, "".join(text), verdict, 200)


async def alone_then_together(
    post: Post, model: str, tenants: tuple[str, str], per_tenant: int = 12
) -> tuple[list[Answer], list[Answer], dict[str, str]]:
    secret = {t: f"{t}-{secrets.token_hex(3)}" for t in tenants}
    work = requests(model, secret, per_tenant)
    for tenant, body in work:  # warm: both runs below then find the same prefixes cached
        await answer(post, tenant, body)
    alone = [await answer(post, t, b) for t, b in work]
    together = await asyncio.gather(*(answer(post, t, b) for t, b in work))
    return alone, list(together), secret
