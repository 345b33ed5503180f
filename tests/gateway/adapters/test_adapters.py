"""Other backend kinds: Dynamo takes the namespace as a header; kvfence is not routed yet."""

from gateway.policy.load import parse_policy
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, policy_text, run_gateway

MSG = [{"role": "user", "content": "hi"}]


async def test_dynamo_gets_the_namespace_in_x_tenant_id(upstream: FakeUpstream) -> None:
    text = policy_text(upstream.url).replace("kind: vllm", "kind: dynamo")
    gw, runner = await run_gateway(parse_policy(text, "t.yaml", env=ENV), upstream)
    try:
        resp = await gw.chat(
            "acme",
            {"model": "smollm2", "messages": MSG, "nvext": {"cache_salt": "x"}},
            **{"X-Tenant-Id": "evil"},
        )
        assert resp.status == 200
        got = upstream.received[-1]
        [salt] = got.header_values("x-tenant-id")
        assert salt.startswith("ns1.") and "cache_salt" not in got.json
        assert got.json["nvext"] == {}  # the salt is gone; nvext itself is Dynamo's own field
    finally:
        await gw.session.close()
        await runner.cleanup()
