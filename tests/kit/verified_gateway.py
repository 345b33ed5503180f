"""A verifying gateway in front of a real or fake server (in-process, admin listener included)
for the verification tests and bench: policy text with canary, detective and history settings,
two tenants, and (with `redis_url`) the state replicas share."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from gateway.app import create_app
from gateway.fleet.local_health import Health
from gateway.policy.load import parse_policy
from gateway.policy.reload import HOLDER
from gateway.server import bound_port, start, start_admin
from gateway.verify.service import VERIFY
from gateway.verify.watch import WATCH
from kvfence.keys.apikey import key_digest, mint_key
from tests.kit.vllm_server import MODEL_DIR, SERVED_MODEL

PEPPER = "verify-pepper-0123456789"
ADMIN_TOKEN = "admin-token-0123456789abcdef"
ENV = {"NS_KEY": "verify-namespace-key-0123456789abcdef", "PEPPER": PEPPER, "ADMIN": ADMIN_TOKEN}
KEYS = {"acme": mint_key(), "globex": mint_key()}


def policy_text(
    url: str,
    state_dir: Path,
    *,
    canary: str = "{interval_s: 3600, prompt_tokens: 300}",
    detective: str = f"{{tokenizer: {MODEL_DIR}, block_size: 128}}",
    block_max_age_s: int = 0,
    audit: str = "enforce",
    backends: str = "",
    history: str = "",
    first_byte_s: float = 120,
    redis_url: str = "",
    kind: str = "vllm",
) -> str:
    acme, globex = (key_digest(PEPPER.encode(), KEYS[t]) for t in ("acme", "globex"))
    shared = f"\n          shared: {{redis: {{url: '{redis_url}'}}}}" if redis_url else ""
    more = f", {history}" if history else ""
    return textwrap.dedent(f"""\
        version: 1
        gateway:
          listen: {{host: 127.0.0.1, port: 0}}
          admin: {{host: 127.0.0.1, port: 0, token: {{env: ADMIN}}}}
          state_dir: {state_dir}
          history: {{block_max_age_s: {block_max_age_s}{more}}}{shared}
          namespace_keys: [{{id: ns1, secret: {{env: NS_KEY}}, active: true}}]
          api_key_pepper: {{env: PEPPER}}
          timeouts: {{connect_s: 5, first_byte_s: {first_byte_s}, idle_s: 60}}
          access_log: false
        backends:
          - name: upstream
            kind: {kind}
            url: {url}
            audit: {audit}
            verify: {{canary: {canary}, detective: {detective}}}
            models: [{{name: {SERVED_MODEL}, revision: "1"}}]
        """) + backends + textwrap.dedent(f"""\
        tenants:
          - {{id: acme, api_keys: ["{acme}"], scope: tenant, models: [{SERVED_MODEL}]}}
          - {{id: globex, api_keys: ["{globex}"], scope: tenant, models: [{SERVED_MODEL}]}}
        """)  # fmt: skip


@dataclass
class Verified:
    url: str
    admin_url: str
    app: web.Application
    session: aiohttp.ClientSession

    async def chat(self, tenant: str, text: str, **extra: Any) -> aiohttp.ClientResponse:
        body = {"model": SERVED_MODEL, "messages": [{"role": "user", "content": text}],
                "max_tokens": 2, "temperature": 0, **extra}  # fmt: skip
        headers = {"authorization": f"Bearer {KEYS[tenant]}"}
        return await self.session.post(
            self.url + "/v1/chat/completions", json=body, headers=headers
        )

    async def post(self, tenant: str, path: str, body: dict[str, Any]) -> aiohttp.ClientResponse:
        headers = {"authorization": f"Bearer {KEYS[tenant]}"}
        return await self.session.post(self.url + path, json=body, headers=headers)

    async def round(self, backend: str = "upstream") -> Health:
        watch = self.app[WATCH]
        found = next(b for b in self.app[HOLDER].runtime.policy.backends if b.name == backend)
        await watch.round(found)
        return self.app[VERIFY].health.get(backend)

    def health(self, backend: str = "upstream") -> Health:
        return self.app[VERIFY].health.get(backend)

    async def admin(self, method: str, path: str, token: str | None = ADMIN_TOKEN) -> Any:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        resp = await self.session.request(method, self.admin_url + path, headers=headers)
        return resp.status, await resp.json()


@asynccontextmanager
async def verified_gateway(text: str) -> AsyncIterator[Verified]:
    app = create_app(parse_policy(text, "verify.yaml", env=ENV))
    runner = await start(app, "127.0.0.1", 0)
    admin = await start_admin(app, "127.0.0.1", 0)
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300))
    try:
        yield Verified(
            f"http://127.0.0.1:{bound_port(runner)}",
            f"http://127.0.0.1:{bound_port(admin)}",
            app,
            session,
        )
    finally:
        await session.close()
        await admin.cleanup()
        await runner.cleanup()
