"""Every route a client sends through one gateway: embeddings are authenticated, scoped (the
namespace as `cache_salt`) and allowlisted like the others; vLLM's `/tokenize` and
`/detokenize` reach it unscoped (they touch no cache); a path a backend kind does not serve is a
404 naming the paths it does, never a 5xx; and every answer of the gateway's own carries the
verdict header."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.policy.load import parse_policy
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, Gateway, policy_text, run_gateway


async def post(
    gw: Gateway, path: str, body: dict[str, object], tenant: str = "acme"
) -> tuple[int, dict[str, object], str]:
    resp = await gw.session.post(gw.url + path, json=body, headers=gw.auth(tenant))
    return resp.status, await resp.json(), resp.headers.get("x-kvfence-verdict", "")


async def test_embeddings_are_scoped_and_allowlisted(gw: Gateway) -> None:
    body = {"model": "smollm2", "input": ["a", "b"], "encoding_format": "base64",
            "cache_salt": "mine", "kv_transfer_params": {}}  # fmt: skip
    status, _, verdict = await post(gw, "/v1/embeddings", body)
    assert status == 200 and verdict == "unverified"  # a vLLM answer, as on every path
    sent = gw.upstream.received[-1]
    assert sent.path == "/v1/embeddings"
    assert sent.json["cache_salt"].startswith("ns1.")  # the gateway's, never the client's
    assert set(sent.json) == {"model", "input", "encoding_format", "cache_salt"}
    # A user-scoped tenant must name its end user, as on every cached path.
    status, error, _ = await post(gw, "/v1/embeddings", {"model": "smollm2", "input": "a"},
                                  tenant="initech")  # fmt: skip
    assert status == 400 and error["error"]["code"] == "missing_scope_value"  # type: ignore[index]


async def test_tokenize_and_detokenize_reach_vllm_unscoped(gw: Gateway) -> None:
    tokenize = {"model": "smollm2", "messages": [{"role": "user", "content": "hi", "uuid": "u"}],
                "cache_salt": "mine", "add_generation_prompt": True}  # fmt: skip
    # No scope value needed: the tokenizer touches no cache.
    status, _, _ = await post(gw, "/tokenize", tokenize, tenant="initech")
    assert status == 200
    sent = gw.upstream.received[-1].json
    assert gw.upstream.received[-1].path == "/tokenize"
    assert sent == {"model": "smollm2", "add_generation_prompt": True,
                    "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    status, _, _ = await post(gw, "/detokenize", {"model": "smollm2", "tokens": [1, 2]})
    assert status == 200 and gw.upstream.received[-1].json == {"model": "smollm2", "tokens": [1, 2]}
    assert "kvfence_gateway_namespaces_injected_total{" not in await gw.metrics()


@pytest.fixture
async def narrow(upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    """A model served by trtllm (chat only) and one by sglang (no embeddings, no tokenizer)."""
    text = policy_text(upstream.url).replace("kind: vllm", "kind: trtllm")
    text = text.replace(
        "tenants:",
        f"""  - name: sg
    kind: sglang
    url: {upstream.url}
    verify: {{canary: false}}
    models: [{{name: sg-model, revision: "1"}}]
tenants:""",
    )
    text = text.replace("models: [smollm2, other]}", "models: [smollm2, other, sg-model]}")
    gw, runner = await run_gateway(parse_policy(text, "t.yaml", env=ENV), upstream)
    yield gw
    await gw.session.close()
    await runner.cleanup()


async def test_a_path_a_backend_does_not_serve_is_a_404_naming_those_it_does(
    narrow: Gateway,
) -> None:
    cases = {
        ("/v1/completions", "smollm2"): "its backends serve /v1/chat/completions",
        ("/v1/responses", "smollm2"): "its backends serve /v1/chat/completions",
        ("/v1/embeddings", "sg-model"): "/v1/chat/completions, /v1/completions, /v1/responses",
        ("/tokenize", "sg-model"): "/v1/chat/completions, /v1/completions, /v1/responses",
    }
    for (path, model), served in cases.items():
        status, error, verdict = await post(narrow, path, {"model": model, "input": "x"}, "globex")
        assert status == 404, path
        assert error["error"]["code"] == "path_not_served"  # type: ignore[index]
        assert served in error["error"]["message"]  # type: ignore[index]
        assert verdict == "unattested"
    assert narrow.upstream.received == []


async def test_every_answer_of_the_gateways_own_carries_the_verdict(gw: Gateway) -> None:
    session = gw.session
    answers = [
        await session.post(gw.url + "/v1/nothing", json={}),  # 404 no route
        await session.post(gw.url + "/v1/chat/completions", json={}),  # 401
        await session.post(gw.url + "/v1/chat/completions", data=b"[", headers=gw.auth("acme")),
        await session.post(
            gw.url + "/v1/chat/completions", json={"model": "nope"}, headers=gw.auth("acme")
        ),
    ]
    assert [r.status for r in answers] == [404, 401, 400, 404]
    assert all(r.headers.get("x-kvfence-verdict") == "unattested" for r in answers)
