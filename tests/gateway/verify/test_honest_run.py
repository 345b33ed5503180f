"""A long honest run at in-process speed: thousands of requests of a randomized multi-tenant
workload (every scope, multi-turn conversations sending answers back, exact repeats, a
preamble every tenant shares, streams) through the real gateway in front of a fake server that
evicts, restarted twice with its state kept, over a history whose tenant cap evicts too: no
answer is a violation or withheld, and the backend is never quarantined. (The same against a
real vLLM: tests/interop/test_honest_traffic.py and bench/verify_external.py.)"""

from __future__ import annotations

from pathlib import Path

from gateway.app import create_app
from gateway.policy.load import parse_policy
from gateway.server import bound_port, start
from gateway.verify.service import VERIFY
from gateway.verify.watch import WATCH
from tests.fakes.cache_server import CacheServer
from tests.kit.polling import until
from tests.kit.vllm_server import SERVED_MODEL
from tests.kit.workload import ENV, KEYS, SCOPES, Tally, Tenant, Workload, policy, run, sentence

PREAMBLE = "Company rules for every assistant: be brief, be exact, never guess. " * 3
REQUESTS = 2400  # three runs of 800, the gateway restarted between them


async def test_thousands_of_honest_requests_never_violate(tmp_path: Path) -> None:
    rng = Workload([], SERVED_MODEL, 0).rng
    tenants = [
        Tenant(t, KEYS[t], scope, f"{PREAMBLE}You are {t}'s assistant. {sentence(rng, 30)}")
        for t, scope in SCOPES.items()
    ]
    work = Workload(tenants, SERVED_MODEL, seed=21)
    fake = CacheServer(device_blocks=600)  # a few hundred prompts: it evicts all along
    await fake.start()
    text = policy(fake.url, tmp_path / "state", 0, 0, 3600, detective="{block_size: 16}",
                  history="capacity: 4096, tenant_cap: 512",
                  canary="{interval_s: 3600, prompt_tokens: 64}")  # fmt: skip
    tallies: list[Tally] = []
    try:
        for _ in range(3):
            app = create_app(parse_policy(text, "honest.yaml", env=ENV))
            runner = await start(app, "127.0.0.1", 0)
            try:
                await until(lambda app=app: app[VERIFY].health.get("vllm").rounds >= 1,
                            what="the first canary round")  # fmt: skip
                tallies.append(await run(work, f"http://127.0.0.1:{bound_port(runner)}", 800))
                await app[WATCH].idle()
                health = app[VERIFY].health.get("vllm")
                reach = await app[VERIFY].store.reach()
            finally:
                await runner.cleanup()
    finally:
        await fake.close()
    total = sum(t.requests for t in tallies)
    verdicts = sum((t.verdicts for t in tallies), start=tallies[0].verdicts.__class__())
    assert total == REQUESTS and sum(t.statuses[200] for t in tallies) == REQUESTS, tallies
    assert verdicts["violation"] == 0 and verdicts["stream-error"] == 0, verdicts
    assert sum(t.cached for t in tallies) > REQUESTS // 4  # the workload really hits its cache
    assert not health.quarantined and health.violations == {}, health
    assert any(r.evicted for r in reach)  # the tenant cap did evict
