"""Verifying a real vLLM: canary rounds, the detective audit, quarantine and release; and the
same behind a proxy that drops `cache_salt` (the failure verification exists for)."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.fakes.salt_dropping_proxy import RewritingProxy
from tests.kit.concurrent_sessions import alone_then_together
from tests.kit.polling import until
from tests.kit.verified_gateway import KEYS, Verified, policy_text, verified_gateway
from tests.kit.vllm_server import MODEL_DIR, SERVED_MODEL

pytestmark = pytest.mark.vllm


def fresh_text(words: int = 300) -> str:
    """A prompt no cache holds yet, over two of vLLM's 128-token blocks."""
    return " ".join(secrets.token_hex(2) for _ in range(words // 2))


async def first_round(gw: Verified) -> None:
    await until(lambda: gw.health().rounds >= 1, timeout_s=120, what="the first canary round")


async def test_a_scoping_vllm_is_isolated_and_answers_are_verified(
    vllm_url: str, tmp_path: Path
) -> None:
    async with verified_gateway(policy_text(vllm_url, tmp_path)) as gw:
        await first_round(gw)
        health = gw.health()
        assert (health.canary, health.quarantined) == ("isolated", False), health
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
        resp = await gw.chat("acme", fresh_text())
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == "backend_quarantined"
        # Only an authenticated operator releases it early.
        assert (await gw.admin("POST", "/quarantine/upstream/release", token=None))[0] == 401
        assert (await gw.admin("POST", "/quarantine/upstream/release", token="x" * 30))[0] == 401
        status, body = await gw.admin("POST", "/quarantine/upstream/release")
        assert status == 200 and body["health"]["quarantined"] is False
        assert (await gw.chat("acme", fresh_text())).status == 200


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "bound"])
async def test_the_detective_flags_tenant_bs_first_unexplained_hit(
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
        assert leaked.status == 502
        assert leaked.headers["x-kvfence-verdict"] == "violation"
        assert gw.health().quarantined and gw.health().violations == {"detective": 1}


async def test_an_unexplained_hit_inside_the_history_window_is_not_a_violation(
    vllm_url: str, tmp_path: Path
) -> None:
    text = policy_text("", tmp_path, canary="false", block_max_age_s=3600)
    async with (
        RewritingProxy(vllm_url) as proxy,
        verified_gateway(text.replace("url: \n", f"url: {proxy.url}\n")) as gw,
    ):
        prompt = fresh_text(400)
        assert (await gw.chat("acme", prompt)).status == 200
        leaked = await gw.chat("globex", prompt)
        assert leaked.status == 200 and leaked.headers["x-kvfence-verdict"] == "unexplained"
        assert not gw.health().quarantined


async def test_without_usage_the_canary_finds_sharing_by_timing(
    vllm_url: str, tmp_path: Path
) -> None:
    async with (
        RewritingProxy(vllm_url, strip_usage=True) as proxy,
        verified_gateway(policy_text(proxy.url, tmp_path)) as gw,
    ):
        await first_round(gw)
        health = gw.health()
        assert health.canary == "shared" and "first-token" in health.canary_reason, health


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
