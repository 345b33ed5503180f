"""Every route through one gateway in front of the real vLLM, with the official `openai` client
where it has a call: `/v1/responses` (plain and streamed) and `/v1/embeddings` (on a pooling
vLLM: `--runner pooling --convert embed`, since one vLLM either generates or pools), each scoped
per tenant; `/tokenize` and `/detokenize` as vLLM answers them directly.

The embeddings answer reports no cached tokens, so the scope is checked on vLLM's own counter
of prefix-cache hits (`vllm:prefix_cache_hits_total`): a tenant's repeat hits, another tenant's
copy does not.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import AsyncIterator, Iterator

import aiohttp
import openai
import pytest

from gateway.app import create_app
from gateway.policy.load import parse_policy
from gateway.server import bound_port, start
from kvfence.keys.apikey import key_digest, mint_key
from tests.interop.probes import fresh_prompt
from tests.kit.vllm_server import SERVED_MODEL, VllmConfig, running_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

EMBED_MODEL = "smollm2-embed"
PEPPER = "interop-pepper-0123456789"
ENV = {"NS_KEY": "interop-namespace-key-0123456789abcdef", "PEPPER": PEPPER}
KEYS = {"alpha": mint_key(), "beta": mint_key()}


@pytest.fixture(scope="module")
def pooling_url() -> Iterator[str]:
    """A second real vLLM, serving SmolLM2 as an embedding model with prefix caching on."""
    config = VllmConfig(served_model=EMBED_MODEL, kv_cache_gib=1,
                        extra_args=("--runner", "pooling", "--convert", "embed"))  # fmt: skip
    with running_vllm(config) as url:
        yield url


def policy_text(chat_url: str, embed_url: str) -> str:
    alpha, beta = (key_digest(PEPPER.encode(), KEYS[t]) for t in ("alpha", "beta"))
    models = f"[{SERVED_MODEL}, {EMBED_MODEL}]"
    return textwrap.dedent(f"""\
        version: 1
        gateway:
          listen: {{host: 127.0.0.1, port: 0}}
          namespace_keys: [{{id: ns1, secret: {{env: NS_KEY}}, active: true}}]
          api_key_pepper: {{env: PEPPER}}
          access_log: false
        backends:
          - name: vllm-chat
            kind: vllm
            url: {chat_url}
            verify: {{canary: false}}
            models: [{{name: {SERVED_MODEL}, revision: "1"}}]
          - name: vllm-embed
            kind: vllm
            url: {embed_url}
            verify: {{canary: false}}
            models: [{{name: {EMBED_MODEL}, revision: "1"}}]
        tenants:
          - {{id: alpha, api_keys: ["{alpha}"], scope: tenant, models: {models}}}
          - {{id: beta, api_keys: ["{beta}"], scope: tenant, models: {models}}}
        """)


@pytest.fixture
async def gateway_url(vllm_url: str, pooling_url: str) -> AsyncIterator[str]:
    app = create_app(parse_policy(policy_text(vllm_url, pooling_url), "routes.yaml", env=ENV))
    runner = await start(app, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{bound_port(runner)}"
    finally:
        await runner.cleanup()


def client(url: str, tenant: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEYS[tenant], max_retries=0)


async def test_responses_through_the_openai_client_scoped_per_tenant(gateway_url: str) -> None:
    prompt = fresh_prompt()
    async with client(gateway_url, "alpha") as alpha, client(gateway_url, "beta") as beta:
        first = await alpha.responses.create(model=SERVED_MODEL, input=prompt, max_output_tokens=4)
        again = await alpha.responses.create(model=SERVED_MODEL, input=prompt, max_output_tokens=4)
        other = await beta.responses.create(model=SERVED_MODEL, input=prompt, max_output_tokens=4)
        assert first.output_text and first.usage is not None
        assert first.usage.input_tokens_details.cached_tokens == 0
        assert again.usage is not None and again.usage.input_tokens_details.cached_tokens > 0
        assert other.usage is not None and other.usage.input_tokens_details.cached_tokens == 0
        stream = await alpha.responses.create(
            model=SERVED_MODEL, input="Say hi.", max_output_tokens=8, stream=True
        )
        kinds = [event.type async for event in stream]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds


async def _hits(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    found = re.search(r"^vllm:prefix_cache_hits_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    assert found, "vLLM exports vllm:prefix_cache_hits_total"
    return float(found.group(1))


async def test_embeddings_through_the_openai_client_scoped_per_tenant(
    gateway_url: str, pooling_url: str
) -> None:
    text = fresh_prompt()
    async with (
        aiohttp.ClientSession() as http,
        client(gateway_url, "alpha") as alpha,
        client(gateway_url, "beta") as beta,
    ):
        start = await _hits(http, pooling_url)
        first = await alpha.embeddings.create(model=EMBED_MODEL, input=text)
        assert len(first.data[0].embedding) == 576  # SmolLM2's hidden size
        assert await _hits(http, pooling_url) == start  # a fresh prompt: nothing cached yet
        await alpha.embeddings.create(model=EMBED_MODEL, input=text)
        repeat = await _hits(http, pooling_url)
        assert repeat > start  # the positive control: alpha's blocks are reused
        await beta.embeddings.create(model=EMBED_MODEL, input=text)
        assert await _hits(http, pooling_url) == repeat  # beta's copy reuses none of them
        batch = await beta.embeddings.create(model=EMBED_MODEL, input=["one", "two"])
        assert [d.index for d in batch.data] == [0, 1]


async def test_tokenize_and_detokenize_answer_as_vllm_does(gateway_url: str, vllm_url: str) -> None:
    auth = {"authorization": f"Bearer {KEYS['alpha']}"}
    body = {"model": SERVED_MODEL, "prompt": "The capital of France"}
    async with aiohttp.ClientSession() as http:
        async with http.post(gateway_url + "/tokenize", json=body, headers=auth) as resp:
            assert resp.status == 200
            through = await resp.json()
        async with http.post(vllm_url + "/tokenize", json=body) as resp:
            direct = await resp.json()
        assert through["tokens"] == direct["tokens"] and through["count"] == len(direct["tokens"])
        back = {"model": SERVED_MODEL, "tokens": through["tokens"]}
        async with http.post(gateway_url + "/detokenize", json=back, headers=auth) as resp:
            assert resp.status == 200 and (await resp.json())["prompt"] == body["prompt"]
        chat = {"model": SERVED_MODEL, "messages": [{"role": "user", "content": "Hi"}]}
        async with http.post(gateway_url + "/tokenize", json=chat, headers=auth) as resp:
            assert resp.status == 200 and (await resp.json())["count"] > 3
        async with http.post(gateway_url + "/tokenize", json=body) as resp:
            assert resp.status == 401  # authenticated like every route
