"""The model cards the backends' own `GET /v1/models` give (vLLM's `max_model_len`, `root`,
`permission`, `owned_by`...), for the models a tenant may use; a backend that does not answer in
time, or answers something else, gives none, and the caller falls back to a card of its own.

Invariant: only the cards whose `id` the caller asked for are returned: no other model a backend
serves (another tenant's, an adapter) is ever shown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Final

import aiohttp
import orjson

from gateway.policy.backend_model import Backend

ASK_S: Final = 5.0  # the most a listing waits for a backend's cards
MAX_CARDS_BYTES: Final = 1 << 20


async def _cards(session: aiohttp.ClientSession, backend: Backend) -> list[dict[str, Any]]:
    headers = {"accept": "application/json"}
    if backend.api_key is not None:
        headers["authorization"] = "Bearer " + backend.api_key.value.decode()
    try:
        async with asyncio.timeout(ASK_S):
            async with session.get(backend.url + "/v1/models", headers=headers) as resp:
                if resp.status != 200:
                    return []
                raw = await resp.content.read(MAX_CARDS_BYTES + 1)
    except (TimeoutError, aiohttp.ClientError):
        return []
    try:
        data = orjson.loads(raw).get("data") if len(raw) <= MAX_CARDS_BYTES else None
    except (orjson.JSONDecodeError, AttributeError):
        return []
    return [c for c in data if isinstance(c, dict)] if isinstance(data, list) else []


async def cards(
    session: aiohttp.ClientSession, wanted: dict[str, list[Backend]]
) -> dict[str, dict[str, Any]]:
    """The first card each backend of a wanted model gives under that model's name."""
    backends: dict[str, Backend] = {b.name: b for bs in wanted.values() for b in bs}
    order: Iterable[str] = sorted(backends)
    found = await asyncio.gather(*(_cards(session, backends[name]) for name in order))
    by_backend = dict(zip(order, found, strict=True))
    out: dict[str, dict[str, Any]] = {}
    for model, serving in wanted.items():
        for backend in serving:
            card = next((c for c in by_backend[backend.name] if c.get("id") == model), None)
            if card is not None:
                out[model] = card
                break
    return out
