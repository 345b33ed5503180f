"""Leaky layers the tests never saw before this suite: each class of partial scope failure
(by body size, path, streaming, message count, a sampling field; one that starts after the
last round; an offload tier; a count that lies; a server that ignores the salt) ends
quarantined under `enforce`, and B is never served a hit on A's document. (A partial layer
whose count also lies, found by the scheduled rounds' sweep of shapes: bench/verify_classes.)"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway.policy.backend_model import CanarySettings
from gateway.verify.timing import most_requests
from gateway.verify.watch import WATCH
from tests.fakes import leaky_layers as layers
from tests.fakes.salt_dropping_proxy import When
from tests.kit.leak_scenarios import (
    Make,
    chat,
    completions,
    document,
    leaky_gateway,
    never,
    read,
    until_quarantined,
)
from tests.kit.verified_gateway import Verified

CANARY = "{interval_s: 3600, prompt_tokens: 64}"
BOUND = "{block_size: 16}"
LYING = 3 * (3 + most_requests(CanarySettings()))  # a timing round and those confirming it


@asynccontextmanager
async def leaky(
    tmp: Path,
    when: When | None,
    server: dict[str, Any] | None = None,
    *,
    zero: bool = False,
    kind: str = "vllm",
) -> AsyncIterator[Verified]:
    async with leaky_gateway(tmp, when, server, zero=zero, kind=kind) as (gw, _):
        yield gw


NEVER = never
CLASSES: dict[str, tuple[When, Make, int]] = {  # layer, the traffic it leaks on, most requests
    "by body size": (layers.by_size(2500), chat(), 8),
    "by path": (layers.by_path("/v1/completions"), completions(), 8),
    "by streaming": (layers.by_stream, chat(stream=True), 8),
    "by message count": (layers.by_messages(3), chat(messages=4), 8),
    "by a sampling field": (layers.by_field("seed"), chat(seed=7), 8),
}


@pytest.mark.parametrize("name", sorted(CLASSES))
async def test_a_partial_layer_is_quarantined_and_serves_no_cross_hit(
    tmp_path: Path, name: str
) -> None:
    when, make, most = CLASSES[name]
    async with leaky(tmp_path, when) as gw:
        tally = await until_quarantined(gw, make, pairs=6, rng=random.Random(1), words=600)
    assert tally.quarantined, tally
    assert tally.served_hits == 0 and tally.requests <= most, tally


async def test_a_layer_that_starts_leaking_after_the_last_round_is_caught_at_once(
    tmp_path: Path,
) -> None:
    switch = layers.Switch()
    async with leaky(tmp_path, switch) as gw:
        assert gw.health().canary == "isolated"
        switch.on = True  # the next scheduled round is an hour away
        tally = await until_quarantined(gw, chat(), pairs=6, rng=random.Random(2))
    assert tally.quarantined and tally.served_hits == 0, tally
    assert tally.tenant_requests == 2 and "violation" in tally.verdicts, tally


@pytest.mark.parametrize(
    ("layer", "server", "kind"),
    [
        (None, {"host": "unsalted"}, "sglang"),  # an offload tier keyed without the salt
        (NEVER, {"honours_salt": False}, "max"),  # MAX Serve started without its salt flag
    ],
    ids=["offload tier", "max without its salt flag"],
)
async def test_a_server_that_shares_is_quarantined_by_the_first_round(
    tmp_path: Path, layer: When | None, server: dict[str, Any], kind: str
) -> None:
    async with leaky(tmp_path, layer or NEVER, server, kind=kind) as gw:
        health = gw.health()
        assert (health.canary, health.quarantined, health.rounds) == ("shared", True, 1)
        if "host" in server:
            assert "host" in health.canary_reason  # the tier that shared is named


async def test_a_count_that_lies_is_decided_by_timing(tmp_path: Path) -> None:
    # Drops the scope and reports 0 cached; a clear timing signal (as vLLM's: bench)
    async with leaky(tmp_path, None, {"token_s": 0.001}, zero=True) as gw:
        health = gw.health()
        assert (health.canary, health.canary_by, health.quarantined) == ("shared", "timing", True)
        assert "confirmed" in health.canary_reason and health.counter == "silent"
        tally = await until_quarantined(gw, chat(), pairs=1, rng=random.Random(3))
    assert tally.tenant_requests == 0 and tally.canary_requests <= LYING, tally


async def test_a_withheld_stream_never_shows_its_cached_token_count(tmp_path: Path) -> None:
    switch = layers.Switch()
    async with leaky(tmp_path, switch) as gw:
        switch.on = True
        path, body = chat(stream=True)(document(random.Random(4), 300))
        assert (await read(await gw.post("acme", path, body)))[:2] == (200, "verified")
        resp = await gw.post("globex", path, body)
        raw = await resp.read()
        assert resp.status == 200  # its head went out before the count arrived
        assert b"event: error" in raw and b"[DONE]" not in raw
        assert b"cached_tokens" not in raw and b'"usage"' not in raw
        await gw.app[WATCH].idle()
        assert gw.health().quarantined
