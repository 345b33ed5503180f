"""Verifying a real vLLM: canary rounds, the detective audit, quarantine and release; the same
behind layers that drop `cache_salt` always, only for large bodies (a partial failure the
counter-mode rounds of the usual shape pass), or while reporting `cached_tokens: 0` (timing
decides); and the same tokens sent in four forms, which are one prompt to vLLM and to the
history (exact mode)."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.verify.tokens import ChatTokenizer
from tests.fakes import leaky_layers as layers
from tests.fakes.salt_dropping_proxy import RewritingProxy
from tests.kit.concurrent_sessions import alone_then_together
from tests.kit.leak_scenarios import read
from tests.kit.polling import until
from tests.kit.verified_gateway import KEYS, Verified, policy_text, verified_gateway
from tests.kit.vllm_server import MODEL_DIR, SERVED_MODEL

pytestmark = pytest.mark.vllm


def fresh_text(words: int = 300) -> str:
    """A prompt no cache holds yet, over two of vLLM's 128-token blocks."""
    return " ".join(secrets.token_hex(2) for _ in range(words // 2))


async def first_round(gw: Verified) -> None:
    await until(lambda: gw.health().rounds >= 1, timeout_s=300, what="the first canary round")


async def test_a_scoping_vllm_is_isolated_and_answers_are_verified(
    vllm_url: str, tmp_path: Path
) -> None:
    async with verified_gateway(policy_text(vllm_url, tmp_path)) as gw:
        await first_round(gw)
        health = gw.health()
        assert (health.canary, health.quarantined, health.counter) == ("isolated", False, "honest")
        text = fresh_text()
        for tenant, verdict in (("acme", "verified"), ("acme", "verified"), ("globex", "verified")):
            resp = await gw.chat(tenant, text)
            assert resp.status == 200 and resp.headers["x-kvfence-verdict"] == verdict
        status, body = await gw.admin("GET", "/status")
        assert status == 200 and body["backends"]["upstream"]["canary"] == "isolated"


async def test_a_salt_dropping_proxy_is_shared_in_one_round_then_quarantined(
    vllm_url: str, tmp_path: Path
) -> None:
    async with (
        RewritingProxy(vllm_url) as proxy,
        verified_gateway(policy_text(proxy.url, tmp_path)) as gw,
    ):
        await first_round(gw)
        health = gw.health()
        assert (health.canary, health.quarantined, health.rounds) == ("shared", True, 1)
        assert proxy.forwarded == 3  # one round: A, A's repeat, B
        resp = await gw.chat("acme", fresh_text())
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == "backend_quarantined"
        # Only an authenticated operator releases it early.
        assert (await gw.admin("POST", "/quarantine/upstream/release", token=None))[0] == 401
        assert (await gw.admin("POST", "/quarantine/upstream/release", token="x" * 30))[0] == 401
        status, body = await gw.admin("POST", "/quarantine/upstream/release")
        assert status == 200 and body["health"]["quarantined"] is False
        assert (await gw.chat("acme", fresh_text())).status == 200


async def test_a_layer_that_drops_the_salt_for_large_bodies_is_caught_by_the_detective(
    vllm_url: str, tmp_path: Path
) -> None:
    """The first round (the usual shape) passes; B's hit on A's large document is attributed,
    withheld, and the round it triggers, shaped like it, quarantines the backend."""
    async with (
        RewritingProxy(vllm_url, when=layers.by_size(3000)) as proxy,
        verified_gateway(policy_text(proxy.url, tmp_path)) as gw,
    ):
        await first_round(gw)
        assert gw.health().canary == "isolated"
        doc = fresh_text(1400)  # about 3.5 kB and 1,700 tokens
        assert (await gw.chat("acme", doc)).status == 200
        leaked = await gw.chat("globex", doc)
        assert (leaked.status, leaked.headers["x-kvfence-verdict"]) == (502, "violation")
        assert "cached_tokens" not in await leaked.text()
        await until(lambda: gw.health().quarantined, timeout_s=120, what="the triggered round")
        assert gw.health().triggered == 1 and gw.health().violations == {
            "detective": 1,
            "canary": 1,
        }


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "bound"])
async def test_with_canaries_off_the_detective_still_withholds_an_attributed_hit(
    vllm_url: str, tmp_path: Path, exact: bool
) -> None:
    detective = f"{{tokenizer: {MODEL_DIR}, block_size: 128}}" if exact else "{block_size: 128}"
    text = policy_text("", tmp_path, canary="false", detective=detective)
    async with (
        RewritingProxy(vllm_url) as proxy,
        verified_gateway(text.replace("url: \n", f"url: {proxy.url}\n")) as gw,
    ):
        prompt = fresh_text(400)
        first = await gw.chat("acme", prompt)
        assert first.status == 200 and first.headers["x-kvfence-verdict"] == "unverified"
        again = await gw.chat("acme", prompt)  # A's own repeat: a hit its history explains
        assert again.headers["x-kvfence-verdict"] == "unverified"
        assert (await again.json())["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        leaked = await gw.chat("globex", prompt)  # B gets A's blocks: the salt was dropped
        assert (leaked.status, leaked.headers["x-kvfence-verdict"]) == (502, "violation")
        assert not gw.health().quarantined  # only a round or a marker quarantines


@pytest.mark.soak  # minutes of timed rounds: `scripts/test -m soak` (CI's tiers leave it out)
async def test_a_count_that_lies_is_decided_by_timing(vllm_url: str, tmp_path: Path) -> None:
    async with (
        RewritingProxy(vllm_url, zero_cached=True) as proxy,  # drops the salt, reports 0
        verified_gateway(policy_text(proxy.url, tmp_path)) as gw,
    ):
        await first_round(gw)
        outcomes = [gw.health().canary]
        # A busy host can leave a timing round `inconclusive` (never `isolated`): more rounds,
        # as the schedule would run them, until two agree that it shares.
        while not gw.health().quarantined and len(outcomes) < 5:
            assert outcomes[-1] != "isolated", outcomes
            outcomes.append((await gw.round()).canary)
        health = gw.health()
        assert "isolated" not in outcomes, outcomes
        assert (health.canary, health.canary_by, health.quarantined) == ("shared", "timing", True)
        assert "confirmed" in health.canary_reason, health


def forms(tok: ChatTokenizer, text: str) -> list[tuple[str, dict[str, Any], str, dict[str, Any]]]:
    messages = [{"role": "user", "content": text}]
    head, tail = text[: len(text) // 2], text[len(text) // 2 :]
    rendered = tok.chat_text(messages)
    assert rendered is not None
    chat, completions = "/v1/chat/completions", "/v1/completions"
    return [
        (chat, {"messages": [{"role": "user", "content": [
            {"type": "text", "text": head}, {"type": "text", "text": tail}]}]},
         chat, {"messages": [{"role": "user", "content": head + "\n" + tail}]}),
        (completions, {"prompt": text}, completions, {"prompt": tok.text_ids(text)}),
        (chat, {"messages": messages}, completions, {"prompt": rendered}),
        (chat, {"messages": messages}, completions, {"prompt": tok.text_ids(rendered, False)}),
    ]  # fmt: skip


async def test_the_same_tokens_in_four_forms_are_one_prompt(vllm_url: str, tmp_path: Path) -> None:
    tok = ChatTokenizer(MODEL_DIR)
    async with verified_gateway(policy_text(vllm_url, tmp_path)) as gw:
        await first_round(gw)
        for path1, body1, path2, body2 in forms(tok, fresh_text(400)):
            for path, body in ((path1, body1), (path2, body2)):
                body = {"model": SERVED_MODEL, "max_tokens": 2, "temperature": 0, **body}
                status, verdict, cached, cut = await read(await gw.post("acme", path, body))
                assert (status, verdict, cut) == (200, "verified", False), (path, body.keys())
            assert cached > 0  # the second form hit the first one's blocks: one prompt
        assert not gw.health().quarantined and gw.health().violations == {}


async def test_two_concurrent_sessions_through_vllm_share_nothing(
    vllm_url: str, tmp_path: Path
) -> None:
    async with verified_gateway(policy_text(vllm_url, tmp_path)) as gw:
        await first_round(gw)

        async def post(tenant: str, body: dict[str, Any]) -> aiohttp.ClientResponse:
            headers = {"authorization": f"Bearer {KEYS[tenant]}"}
            return await gw.session.post(
                gw.url + "/v1/chat/completions", json=body, headers=headers
            )

        alone, together, secret = await alone_then_together(post, SERVED_MODEL, ("acme", "globex"))
    # vLLM's CPU kernels are batch-variant: a greedy answer may change with what shares its
    # batch, so the texts are not compared (kvfence's own backend is, in tests/e2e). What must
    # hold is that no answer carries the other tenant's secret and every one is verified.
    for got in (*alone, *together):
        assert (got.status, got.verdict) == (200, "verified"), got
        assert secret["globex" if got.tenant == "acme" else "acme"] not in got.text


@pytest.mark.soak  # a second vLLM (caching off) and its timed rounds: `scripts/test -m soak`
async def test_caching_off_is_inconclusive_never_isolated(
    uncached_vllm_url: str, tmp_path: Path
) -> None:
    async with verified_gateway(policy_text(uncached_vllm_url, tmp_path)) as gw:
        await first_round(gw)
        health = gw.health()
        assert health.canary == "inconclusive" and "no cached tokens" in health.canary_reason
        assert not health.quarantined  # an alert, never a pass and never a quarantine
        resp = await gw.chat("acme", fresh_text())
        assert resp.status == 200 and resp.headers["x-kvfence-verdict"] == "unverified"
