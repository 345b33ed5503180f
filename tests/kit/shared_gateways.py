"""Two gateway apps (the real app and listener, in this process) sharing one real redis-server,
in front of two fake backends `a` and `b` of one model: for the shared-state tests and
bench/pressure.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.policy.load import parse_policy
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.fleet_policies import fleet_policy_text, replica
from tests.kit.gateway import ENV, Gateway, run_gateway
from tests.kit.redis_server import RedisServer

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}


@asynccontextmanager
async def two_gateways(
    server: RedisServer, on_failure: str = "closed", limits: str = "", redis: str = ""
) -> AsyncIterator[tuple[Gateway, Gateway, FakeUpstream, FakeUpstream]]:
    """`limits`: acme's tenant limits; `redis`: more keys of `shared.redis`."""
    a, b = FakeUpstream(), FakeUpstream()
    await a.start()
    await b.start()
    redis = f"{{url: '{server.url}', timeout_s: 0.2{', ' + redis if redis else ''}}}"
    shared = f"  shared: {{redis: {redis}, on_failure: {on_failure}}}\n"
    text = fleet_policy_text(replica("a", a.url), replica("b", b.url), gateway=shared)
    if limits:
        text = text.replace("id: acme, ", f"id: acme, limits: {{{limits}}}, ")
    policy = parse_policy(text, "p.yaml", env=ENV)
    one, r1 = await run_gateway(policy, a)
    two, r2 = await run_gateway(policy, a)
    try:
        yield one, two, a, b
    finally:
        for gw, runner in ((one, r1), (two, r2)):
            await gw.session.close()
            await runner.cleanup()
        await a.close()
        await b.close()
