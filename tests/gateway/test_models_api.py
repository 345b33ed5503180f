"""`GET /v1/models` as a tenant sees it while backends come and go: a model whose every backend
is down by the gateway's health checks is neither listed nor retrieved (as in docker-compose.yml
before `--profile vllm` starts its vLLM); one backend of several up keeps its models listed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.policy.load import parse_policy
from gateway.routing.liveness import LIVENESS
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, Gateway, policy_text, run_gateway
from tests.kit.polling import until

# `other` is also served by `spare`; `third` only by `later`, where nothing listens.
EXTRA_BACKENDS = """\
  - {{name: spare, kind: vllm, url: '{spare}', required: false, verify: {{canary: false}},
     models: [{{name: other, revision: '2'}}]}}
  - {{name: later, kind: vllm, url: 'http://127.0.0.1:9', required: false,
     verify: {{canary: false}}, models: [{{name: third, revision: '1'}}]}}
tenants:"""


@pytest.fixture
async def fleet(upstream: FakeUpstream) -> AsyncIterator[tuple[Gateway, FakeUpstream]]:
    spare = FakeUpstream()
    await spare.start()
    text = policy_text(upstream.url).replace("tenants:", EXTRA_BACKENDS.format(spare=spare.url))
    text = text.replace("models: [smollm2, other]}", "models: [smollm2, other, third]}")
    gw, runner = await run_gateway(parse_policy(text, "t.yaml", env=ENV), upstream)
    await until(lambda: gw.app[LIVENESS].first_round.is_set(), 10, "the first health checks")
    yield gw, spare
    await gw.session.close()
    await runner.cleanup()
    await spare.close()


async def _listed(gw: Gateway) -> list[str]:
    async with gw.session.get(gw.url + "/v1/models", headers=gw.auth("globex")) as resp:
        assert resp.status == 200
        return [m["id"] for m in (await resp.json())["data"]]


async def _retrieved(gw: Gateway, model: str) -> tuple[int, str]:
    url = f"{gw.url}/v1/models/{model}"
    async with gw.session.get(url, headers=gw.auth("globex")) as resp:
        body = await resp.json()
        return resp.status, body["id"] if resp.status == 200 else body["error"]["code"]


async def test_a_model_whose_every_backend_is_down_is_not_offered(
    fleet: tuple[Gateway, FakeUpstream],
) -> None:
    gw, spare = fleet
    assert await _listed(gw) == ["other", "smollm2"]
    assert await _retrieved(gw, "third") == (404, "model_not_found")
    assert await _retrieved(gw, "other") == (200, "other")

    gw.upstream.unhealthy = True  # serves smollm2 and other; spare still serves other
    await until(lambda: _is_listed(gw, ["other"]), 15, "smollm2 leaving the list")
    assert await _retrieved(gw, "smollm2") == (404, "model_not_found")
    assert await _retrieved(gw, "other") == (200, "other")

    spare.unhealthy = True
    await until(lambda: _is_listed(gw, []), 15, "other leaving the list")
    gw.upstream.unhealthy = spare.unhealthy = False
    await until(lambda: _is_listed(gw, ["other", "smollm2"]), 15, "both models back")
    assert await _retrieved(gw, "smollm2") == (200, "smollm2")


async def _is_listed(gw: Gateway, models: list[str]) -> bool:
    return await _listed(gw) == models
