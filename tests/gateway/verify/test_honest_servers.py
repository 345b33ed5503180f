"""Servers as they are, over many rounds, never quarantined: a slow one whose canary sends time
out (never retried), a jittery one with no count (timing rounds), one that restarts, one that
reports disaggregated-prefill counts (never a violation), one that caches nothing (never
isolated), and tenants who send the same tokens in other forms."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.cache_server import CacheServer
from tests.kit.leak_scenarios import (
    chat,
    completions,
    document,
    leaky_gateway,
    never,
    read,
    responses,
)
from tests.kit.verified_gateway import Verified

CANARY = "{interval_s: 3600, prompt_tokens: 64}"


@asynccontextmanager
async def serving(
    tmp: Path, first_byte_s: float = 30, **server: Any
) -> AsyncIterator[tuple[Verified, CacheServer]]:
    async with leaky_gateway(tmp, never, server, first_byte_s=first_byte_s) as found:
        yield found


async def rounds(gw: Verified, count: int) -> list[str]:
    outcomes = [gw.health().canary]
    for _ in range(count - 1):
        outcomes.append((await gw.round()).canary)
        assert not gw.health().quarantined, gw.health()
    return outcomes


async def test_a_slow_server_whose_sends_time_out_is_never_shared(tmp_path: Path) -> None:
    # Most sends take longer than the canary waits; none is retried, so no send in B can hit
    # what an abandoned send cached under B's own salt.
    async with serving(tmp_path, first_byte_s=0.05, jitter_s=0.05, seed=3) as (gw, _):
        outcomes = await rounds(gw, 10)
    assert "shared" not in outcomes and "inconclusive" in outcomes, outcomes


async def test_a_jittery_server_without_a_count_is_never_shared(tmp_path: Path) -> None:
    async with serving(tmp_path, counter="none", jitter_s=0.003, token_s=0.0004) as (gw, _):
        outcomes = await rounds(gw, 2)  # timing rounds (more: test_canary_rules, bench)
        assert gw.health().canary_by == "timing"
    assert "shared" not in outcomes and "isolated" in outcomes, outcomes


async def test_a_restarting_server_is_never_shared(tmp_path: Path) -> None:
    async with serving(tmp_path) as (gw, fake):
        outcomes = []
        for _ in range(4):
            fake.down(0.2)  # 503 and an empty cache, then back
            outcomes += await rounds(gw, 2)
    assert "shared" not in outcomes and "inconclusive" in outcomes, outcomes


async def test_disaggregated_prefill_counts_never_make_a_violation(tmp_path: Path) -> None:
    async with serving(tmp_path, counter="pd") as (gw, _):
        assert gw.health().counter == "cold_hits"
        rng = random.Random(4)
        for make in (chat(), chat(stream=True), completions()):
            path, body = make(document(rng, 200))
            for tenant in ("acme", "globex", "globex"):  # B sends exactly A's prompt
                status, verdict, _, cut = await read(await gw.post(tenant, path, body))
                assert status == 200 and not cut and verdict != "violation"
        outcomes = await rounds(gw, 2)
    assert "shared" not in outcomes, outcomes


async def test_a_streamed_responses_answer_ends_with_its_final_event(tmp_path: Path) -> None:
    """The detective holds a stream's usage until it has judged the count; in a Responses
    stream the usage is in the final event, which still reaches the client, once."""
    async with serving(tmp_path) as (gw, _):
        path, body = responses(stream=True)(document(random.Random(5), 120))
        for tenant in ("acme", "acme"):  # the repeat reports a hit its own history explains
            resp = await gw.post(tenant, path, body)
            raw = await resp.read()
            assert resp.status == 200 and resp.headers["x-kvfence-verdict"] != "violation"
            assert raw.count(b'"type":"response.completed"') == 1, raw[-300:]
            assert b"event: error" not in raw


async def test_a_model_that_caches_nothing_is_never_isolated(tmp_path: Path) -> None:
    async with serving(tmp_path, caching=False) as (gw, _):
        health = gw.health()
        assert (health.canary, health.counter, health.quarantined) == (
            "inconclusive", "silent", False)  # fmt: skip
        status, verdict, _, _ = await read(
            await gw.post("acme", *chat()(document(random.Random(1), 99)))
        )
        assert (status, verdict) == (200, "unverified")
        _, body = await gw.admin("GET", "/status")
        assert body["backends"]["upstream"]["verdict_reasons"] == {
            "unverified:round_inconclusive": 1
        }


@pytest.mark.parametrize(
    "forms",
    [
        ("parts", "string"),  # text parts, then the same text as one string
        ("chat", "responses"),  # a chat, then the same conversation as a Responses input
    ],
)
async def test_the_same_tokens_in_another_form_quarantine_nothing(
    tmp_path: Path, forms: tuple[str, str]
) -> None:
    doc = document(random.Random(8), 200)
    bodies = {
        "parts": ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
            {"type": "text", "text": doc[:400]}, {"type": "text", "text": doc[400:]}]}]}),
        "string": ("/v1/chat/completions", {"messages": [
            {"role": "user", "content": doc[:400] + "\n" + doc[400:]}]}),
        "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": doc}]}),
        "responses": ("/v1/responses", {"input": [{"role": "user", "content": doc}]}),
    }  # fmt: skip
    async with serving(tmp_path) as (gw, fake):
        verdicts = []
        for form in forms:
            path, body = bodies[form]
            status, verdict, _, _ = await read(
                await gw.post("acme", path, {"model": "smollm2", **body})
            )
            verdicts.append((status, verdict))
        assert fake.served[-1][1] > 0  # the second form hit the first one's blocks
        assert verdicts == [(200, "verified"), (200, "verified")]
        assert not gw.health().quarantined and gw.health().violations == {}
