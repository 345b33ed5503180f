"""The gateway in front of a real vLLM: each tenant's prefix cache is its own.

A tenant's repeat hits (the positive control); another tenant's identical prompt misses, even when
that tenant sends the first tenant's salt itself.
"""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator

import aiohttp
import pytest

from gateway.app import create_app
from gateway.policy.load import parse_policy
from gateway.server import bound_port, start
from kvfence.keys.apikey import key_digest, mint_key
from kvfence.namespace import NamespaceKey, derive_namespace
from tests.interop.probes import cached_tokens, complete, fresh_prompt, stream_chat
from tests.kit.vllm_server import SERVED_MODEL

pytestmark = pytest.mark.vllm

NS_SECRET = "interop-namespace-key-0123456789abcdef"
PEPPER = "interop-pepper-0123456789"
ENV = {"NS_KEY": NS_SECRET, "PEPPER": PEPPER}
KEYS = {"alpha": mint_key(), "beta": mint_key()}
REVISION = "1"


def policy_text(vllm_url: str) -> str:
    alpha, beta = (key_digest(PEPPER.encode(), KEYS[t]) for t in ("alpha", "beta"))
    return textwrap.dedent(f"""\
        version: 1
        gateway:
          listen: {{host: 127.0.0.1, port: 0}}
          namespace_keys:
            - {{id: ns1, secret: {{env: NS_KEY}}, active: true}}
          api_key_pepper: {{env: PEPPER}}
          timeouts: {{connect_s: 5, first_byte_s: 120, idle_s: 120}}
          access_log: false
        backends:
          - name: local-vllm
            kind: vllm
            url: {vllm_url}
            models: [{{name: {SERVED_MODEL}, revision: "{REVISION}"}}]
        tenants:
          - {{id: alpha, api_keys: ["{alpha}"], scope: tenant, models: [{SERVED_MODEL}]}}
          - {{id: beta, api_keys: ["{beta}"], scope: tenant, models: [{SERVED_MODEL}]}}
        """)


def auth(tenant: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[tenant]}"}


def salt_of(tenant: str) -> str:
    """The salt the gateway derives for `tenant`, as an attacker who learnt it would send it."""
    key = NamespaceKey("ns1", NS_SECRET.encode())
    return derive_namespace(key, tenant, "tenant", "", SERVED_MODEL, REVISION)


@pytest.fixture
async def gateway_url(vllm_url: str) -> AsyncIterator[str]:
    app = create_app(parse_policy(policy_text(vllm_url), "interop.yaml", env=ENV))
    runner = await start(app, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{bound_port(runner)}"
    finally:
        await runner.cleanup()


async def test_tenant_repeat_hits_and_other_tenant_misses(
    gateway_url: str, http: aiohttp.ClientSession
) -> None:
    prompt = fresh_prompt()
    status, first = await complete(http, gateway_url, prompt, headers=auth("alpha"))
    assert status == 200, first
    assert cached_tokens(first) == 0

    _, repeat = await complete(http, gateway_url, prompt, headers=auth("alpha"))
    assert cached_tokens(repeat) > 0  # positive control: the salt reached vLLM and caching is on

    _, other = await complete(http, gateway_url, prompt, headers=auth("beta"))
    assert cached_tokens(other) == 0


async def test_client_sent_salt_of_another_tenant_reaches_nothing(
    gateway_url: str, vllm_url: str, http: aiohttp.ClientSession
) -> None:
    prompt = fresh_prompt()
    await complete(http, gateway_url, prompt, headers=auth("alpha"))
    # Control: alpha's blocks really are stored under this salt, so sending it would hit.
    _, direct = await complete(http, vllm_url, prompt, salt=salt_of("alpha"))
    assert cached_tokens(direct) > 0

    status, forged = await complete(
        http, gateway_url, prompt, salt=salt_of("alpha"), headers=auth("beta")
    )
    assert status == 200, forged
    assert cached_tokens(forged) == 0


async def test_streamed_usage_reports_the_tenants_hits_and_only_when_asked(
    gateway_url: str, http: aiohttp.ClientSession
) -> None:
    prompt = fresh_prompt()
    quiet = await stream_chat(http, gateway_url, prompt, headers=auth("alpha"), include_usage=False)
    assert quiet.done
    assert all(chunk.get("usage") is None for chunk in quiet.chunks)

    stream = await stream_chat(http, gateway_url, prompt, headers=auth("alpha"))
    assert stream.done
    assert cached_tokens(stream.chunks[-1]) > 0

    other = await stream_chat(http, gateway_url, prompt, headers=auth("beta"))
    assert cached_tokens(other.chunks[-1]) == 0
