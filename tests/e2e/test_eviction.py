"""Cache capacity per tenant, not per namespace: a user-scoped tenant flooding the pool under
many user ids cannot evict another tenant's cached blocks below that tenant's floor; with no
floor it can (the control that shows the test can fail)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from backend.model.load import LoadedModel
from tests.kit.stack import Stack, make_backend, make_keys, running_stack

pytestmark = pytest.mark.slow
PROMPT = "Refunds for damaged pallets: the full policy, word for word. " * 2


def completion(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "prompt": prompt, "max_tokens": 1, **extra}


async def cached(stack: Stack, tenant: str, prompt: str, **extra: Any) -> int:
    resp = await stack.post(tenant, completion(prompt, **extra), path="/v1/completions")
    assert resp.status == 200, await resp.text()
    return int((await resp.json())["usage"]["prompt_tokens_details"]["cached_tokens"])


async def flood_then_repeat(
    tmp_path: Path, tiny_model: LoadedModel, acme: str
) -> tuple[int, dict[str, float]]:
    """acme's cached tokens on its repeat after globex's flood, and the backend's per-group
    gauges then (`kvfence_backend_group_blocks`, by `kind` and group)."""
    keys = make_keys(tmp_path)
    settings = {"acme": acme, "globex": "scope: user, cache: {ceiling: 1.0, floor: 0.0}"}
    backend = make_backend(tiny_model, keys, blocks=48)
    async with running_stack(backend, keys, "tiny", tenants=settings) as stack:
        assert await cached(stack, "acme", PROMPT) == 0
        assert await cached(stack, "acme", PROMPT) > 0
        for user in range(40):  # a namespace per user id: the per-namespace quota would not see it
            await cached(stack, "globex", f"filler {user:02d} " * 10, user=f"u{user}")
        got = await cached(stack, "acme", PROMPT)
        async with stack.session.get(stack.backend_url + "/metrics") as resp:
            text = await resp.text()
    gauges = {}
    for line in text.splitlines():
        if match := re.match(
            r'kvfence_backend_group_blocks\{group="([^"]+)",kind="(\w+)"\} (.+)', line
        ):
            gauges[f"{match[2]}:{match[1]}"] = float(match[3])
    return got, gauges


async def test_a_user_scoped_flood_leaves_a_tenant_its_floor(
    tmp_path: Path, tiny_model: LoadedModel
) -> None:
    got, gauges = await flood_then_repeat(
        tmp_path, tiny_model, "scope: tenant, cache: {floor: 0.25}"
    )
    assert got > 0
    floors = sorted(v for k, v in gauges.items() if k.startswith("floor:"))
    assert floors[0] == 0 and floors[-1] > 0  # two groups on /metrics; only acme keeps a floor
    assert len(floors) == 2


async def test_without_a_floor_the_flood_evicts_it(tmp_path: Path, tiny_model: LoadedModel) -> None:
    got, _ = await flood_then_repeat(tmp_path, tiny_model, "scope: tenant, cache: {floor: 0.0}")
    assert got == 0
