"""Zero false violations: a randomized, honest multi-tenant workload through the real gateway
(two workers) in front of the real vLLM, with evictions (vLLM holds 256 blocks), a gateway
restart that keeps its state, and one that loses it while vLLM keeps its cache (then a
namespace's first hit may be withheld, never a quarantine)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.kit.gateway_process import gateway_process
from tests.kit.vllm_server import SERVED_MODEL, free_port
from tests.kit.workload import ENV, KEYS, SCOPES, Tally, Tenant, Workload, policy, run, sentence

pytestmark = [pytest.mark.vllm, pytest.mark.soak]  # minutes: `scripts/test -m soak`
NAMESPACES = 2 + 3 + 4  # two tenant-scoped tenants, three users, four sessions (the workload)


async def status(admin: int) -> dict[str, object]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{admin}/status") as resp,
    ):
        return dict(orjson.loads(await resp.read())["backends"]["vllm"])


def clean(tally: Tally, log: Path) -> None:
    """No violation and no broken stream; every refusal is vLLM on two loaded cores answering
    slower than the timeouts (what this test checks is verdicts, not the backend's speed), and
    those stay rare. The gateway's log travels with a failure."""
    why = f"{tally}\n--- gateway log (tail) ---\n{log.read_text()[-4000:]}"
    assert tally.verdicts["violation"] == 0 and tally.verdicts["stream-error"] == 0, why
    timeouts = tally.errors["504 upstream_timeout"]
    assert tally.statuses[200] + timeouts == tally.requests, why
    assert timeouts <= tally.requests // 20, why


def combined(one: Tally, two: Tally) -> Tally:
    return Tally(one.verdicts + two.verdicts, one.statuses + two.statuses, one.cached + two.cached,
                 one.requests + two.requests, one.errors + two.errors)  # fmt: skip


async def test_honest_traffic_never_gets_a_violation(vllm_url: str, tmp_path: Path) -> None:
    rng_system = Workload([], SERVED_MODEL, 0).rng
    tenants = [
        Tenant(t, KEYS[t], scope, f"You are {t}'s assistant. " + sentence(rng_system, 60))
        for t, scope in SCOPES.items()
    ]
    work = Workload(tenants, SERVED_MODEL, seed=7)
    port, admin = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    kept = tmp_path / "policy.yaml"
    kept.write_text(policy(vllm_url, tmp_path / "state", port, admin, max_age=0))
    with gateway_process(kept, url, env=ENV):
        first = await run(work, url, 120)
    with gateway_process(kept, url, env=ENV):  # restarted: the history stays on disk
        second = await run(work, url, 60)
        health = await status(admin)
    for tally in (first, second):
        clean(tally, kept.with_suffix(".log"))
        assert tally.verdicts["unexplained"] == 0, tally
    assert first.cached > 10 and second.cached > 10  # the workload really hits its cache
    assert health["violations"] == {} and not health["quarantined"]
    lost = tmp_path / "lost.yaml"  # restarted with its history lost; vLLM keeps its cache
    lost.write_text(policy(vllm_url, tmp_path / "fresh", port, admin, max_age=3600))
    with gateway_process(lost, url, env=ENV):
        third = await run(work, url, 80)
        for _ in range(2):  # vLLM's evictions decide how soon such a hit comes: more turns
            if third.verdicts["unexplained"] + third.verdicts["violation"] > 0:
                break
            third = combined(third, await run(work, url, 80))
        health = await status(admin)
    # Its own records lost while vLLM kept its cache, a namespace's first hit on a prefix that
    # another namespace of its tenant (users of one tenant share its system prompt) sent since
    # the restart is attributed to that one and withheld: once per namespace at most, and never
    # a quarantine (docs/verify.md: keep `state_dir`).
    assert third.verdicts["unexplained"] + third.verdicts["violation"] > 0, third
    assert third.verdicts["violation"] <= NAMESPACES, third
    assert not health["quarantined"]
