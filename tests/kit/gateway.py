"""The gateway stack tests and benchmarks start: a policy naming a fake upstream, and the real
gateway (app, listener, edge) on port 0 with a client session."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from gateway.app import create_app
from gateway.metrics import METRICS
from gateway.policy.load import parse_policy
from gateway.policy.model import Policy
from gateway.server import bound_port, start
from kvfence.keys.apikey import key_digest, mint_key
from tests.fakes.openai_upstream import FakeUpstream

PEPPER = "test-pepper-0123456789"
ENV = {"NS_KEY": "n" * 40, "PEPPER": PEPPER, "NS_KEY2": "m" * 40}
KEYS = {"acme": mint_key(), "globex": mint_key(), "initech": mint_key(), "umbrella": mint_key()}


def digest(tenant: str) -> str:
    return key_digest(PEPPER.encode(), KEYS[tenant])


def deadlines(first_byte_s: float = 1, idle_s: float = 1, total_s: float = 1) -> str:
    """A policy's `timeouts` (upstream deadlines) with these values, for a test of a deadline."""
    return f"{{connect_s: 2, first_byte_s: {first_byte_s}, idle_s: {idle_s}, total_s: {total_s}}}"


PATIENT_TIMEOUTS = deadlines(60, 60, 60)
QUICK_TIMEOUTS = deadlines()


def policy_text(
    url: str,
    *,
    mode: str = "strip",
    active: str = "ns1",
    extra: str = "",
    header_s: float = 0.5,
    timeouts: str = PATIENT_TIMEOUTS,
) -> str:
    """The kit's policy. `header_s` is how long a connection may wait for its request's headers
    (0.5 s, so the listener's cuts are quick to test); a test that opens many connections at once
    on a loaded host passes more, or a stall of its own loop between connecting and sending gets
    the connection cut. `timeouts`: the upstream deadlines, a minute each, so that an answer
    arrives whatever the host's load (on a busy host a first byte can take over a second); a
    test of a deadline itself passes QUICK_TIMEOUTS (1 s each) or its own."""
    return (
        textwrap.dedent(f"""\
        version: 1
        gateway:
          listen: {{host: 127.0.0.1, port: 0}}
          admin: {{host: 127.0.0.1, port: 0}}
          namespace_keys:
            - {{id: ns1, secret: {{env: NS_KEY}}, active: {str(active == "ns1").lower()}}}
            - {{id: ns2, secret: {{env: NS_KEY2}}, active: {str(active == "ns2").lower()}}}
          api_key_pepper: {{env: PEPPER}}
          client_inputs: {mode}
          timeouts: {timeouts}
          limits: {{header_timeout_s: {header_s}, body_timeout_s: 0.5, max_body_bytes: 65536}}
          access_log: false
        backends:
          - name: fake-vllm
            kind: vllm
            url: {url}
            verify: {{canary: false}}
            models: [{{name: smollm2, revision: "1"}}, {{name: other, revision: "2"}}]
        tenants:
          - {{id: acme, api_keys: ["{digest("acme")}"], scope: tenant, models: [smollm2]}}
          - {{id: globex, api_keys: ["{digest("globex")}"], scope: tenant,
              models: [smollm2, other]}}
          - {{id: initech, api_keys: ["{digest("initech")}"], scope: user,
              scope_header: x-end-user, models: [smollm2]}}
          - {{id: umbrella, api_keys: ["{digest("umbrella")}"], scope: session,
              models: [smollm2]}}
        """)
        + extra
    )


def make_policy(url: str, **kwargs: str) -> Policy:
    return parse_policy(policy_text(url, **kwargs), "test.yaml", env=ENV)


@dataclass
class Gateway:
    url: str
    upstream: FakeUpstream
    app: web.Application
    session: aiohttp.ClientSession

    async def metrics(self) -> str:
        """What the admin listener's /metrics would show (rendered in-process)."""
        return self.app[METRICS].render().decode()

    def auth(self, tenant: str) -> dict[str, str]:
        return {"authorization": f"Bearer {KEYS[tenant]}"}

    async def chat(
        self, tenant: str, body: dict[str, object], **headers: str
    ) -> aiohttp.ClientResponse:
        return await self.session.post(
            self.url + "/v1/chat/completions", json=body, headers={**self.auth(tenant), **headers}
        )


def client_for(policy: Policy) -> aiohttp.ClientSession:
    """A session that lets an idle connection go at half the time the gateway keeps one
    (`header_timeout_s`), as a careful client does: reusing a connection the server is closing
    at that very moment fails the request with "Server disconnected"."""
    keep = policy.gateway.limits.header_timeout_s / 2
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(keepalive_timeout=keep))


async def run_gateway(
    policy: Policy,
    upstream: FakeUpstream,
    reload_from: Path | None = None,
    state_dir: Path | None = None,
    generation: float | None = None,
) -> tuple[Gateway, web.AppRunner]:
    app = create_app(
        policy,
        reload_from=reload_from,
        reload_interval_s=0.05,
        state_dir=state_dir,
        generation=generation,
    )
    runner = await start(app, "127.0.0.1", 0)
    session = client_for(policy)
    url = f"http://127.0.0.1:{bound_port(runner)}"
    return Gateway(url, upstream, app, session), runner
