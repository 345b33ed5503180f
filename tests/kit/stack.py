"""The real gateway in front of a real kvfence backend on loopback: key files, a policy file,
and both servers, built the way an operator would (files on disk, `load_policy`)."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from backend.engine.engine import Engine, EngineConfig
from backend.engine.sequence import Sequence
from backend.model.load import LoadedModel
from backend.runner import ModelRunner
from backend.server import create_app as create_backend
from backend.service import Backend, ServedModel
from backend.worker import EngineWorker
from gateway.app import create_app as create_gateway
from gateway.policy.load import load_policy
from gateway.server import bound_port, start
from kvfence.attestation import AttestationSigner
from kvfence.handle import HandleVerifier
from kvfence.keys.apikey import key_digest, mint_key
from kvfence.keys.keyfile import (
    TrustStore,
    add_to_trust_file,
    generate_key,
    load_private_key,
    write_private_key,
)
from tests.kit.leaky_engine import LeakyEngine

AUDIENCE = "backend-e2e"
PEPPER = "e2e-pepper-0123456789abcdef"
AUDIT_KEY = "e2e-audit-key-0123456789abcdef"
TENANTS = ("acme", "globex")


@dataclass(frozen=True)
class Keys:
    folder: Path
    api_keys: dict[str, str]

    @property
    def audit_key_file(self) -> Path:
        return self.folder / "audit.key"


def make_keys(folder: Path) -> Keys:
    """Key files as `kvfence keygen` writes them: each side's private key (0600) and the other
    side's trust file; secrets for the namespace key, pepper and audit log."""
    for name in ("gateway", "be"):
        key = generate_key()
        write_private_key(folder / f"{name}.key", key)
        trust = "backend-trust.json" if name == "gateway" else "gateway-trust.json"
        add_to_trust_file(folder / trust, name, key.public_key())
    for name, value in (("ns.key", "n" * 40), ("pepper", PEPPER), ("audit.key", AUDIT_KEY)):
        (folder / name).write_text(value + "\n")
        (folder / name).chmod(0o600)
    return Keys(folder, {t: mint_key() for t in TENANTS})


def write_policy(
    keys: Keys,
    backend_url: str,
    model: str,
    *,
    audit: str = "enforce",
    tenants: dict[str, str] | None = None,
    extra: str = "",
    audit_log: str = "",
) -> Path:
    """The stack's policy; `tenants` replaces a tenant's `scope: tenant` with other settings
    (e.g. `{"globex": "scope: user, cache: {ceiling: 0.5, floor: 0.25}"}`); `extra` is appended
    (top-level sections such as `public:`); `audit_log` replaces the audit log's line (gateway
    lines such as `tests.kit.receipts`' witnessed log and receipts)."""
    digests = {t: key_digest(PEPPER.encode(), k) for t, k in keys.api_keys.items()}
    text = textwrap.dedent(f"""\
        version: 1
        gateway:
          namespace_keys: [{{id: ns1, secret: {{file: ns.key}}, active: true}}]
          api_key_pepper: {{file: pepper}}
          handle_key: {{id: gateway, private_key: {{file: gateway.key}}}}
          audit_log: {{path: audit.jsonl, key: {{file: audit.key}}, fsync: always}}
          timeouts: {{connect_s: 5, first_byte_s: 60, idle_s: 30}}
          access_log: false
        backends:
          - name: own
            kind: kvfence
            url: {backend_url}
            audience: {AUDIENCE}
            attestation_keys: {{file: gateway-trust.json}}
            audit: {audit}
            models: [{{name: {model}, revision: "1"}}]
        tenants:
          - {{id: acme, api_keys: ["{digests["acme"]}"], {{acme}}, models: [{model}]}}
          - {{id: globex, api_keys: ["{digests["globex"]}"], {{globex}}, models: [{model}]}}
        """)
    settings = {"acme": "scope: tenant", "globex": "scope: tenant", **(tenants or {})}
    text = text.replace("{acme}", settings["acme"]).replace("{globex}", settings["globex"])
    if audit_log:
        line = "  audit_log: {path: audit.jsonl, key: {file: audit.key}, fsync: always}\n"
        text = text.replace(line, audit_log)
    text += extra
    path = keys.folder / f"policy-{audit}.yaml"
    path.write_text(text)
    return path


def make_backend(
    loaded: LoadedModel,
    keys: Keys,
    *,
    leaky: bool = False,
    blocks: int = 256,
    leak_into: Callable[[Sequence], bool] | None = None,
) -> web.Application:
    """Our backend app; `leaky` swaps in the test double that maps a foreign block into new
    requests (tests/kit/leaky_engine.py), or only into those `leak_into` picks."""
    return backend_and_runner(loaded, keys, leaky=leaky, blocks=blocks, leak_into=leak_into)[0]


def backend_and_runner(
    loaded: LoadedModel,
    keys: Keys,
    *,
    leaky: bool = False,
    blocks: int = 256,
    leak_into: Callable[[Sequence], bool] | None = None,
) -> tuple[web.Application, ModelRunner]:
    """`make_backend`, and its model runner (whose KV pool a test may read once the engine
    is idle)."""
    runner = ModelRunner(loaded, num_blocks=blocks, block_size=16)
    config = EngineConfig(num_blocks=blocks, block_size=16)
    engine = (LeakyEngine if leaky else Engine)(runner, config)
    if isinstance(engine, LeakyEngine) and leak_into is not None:
        engine.scheduler.leak_into = leak_into  # type: ignore[method-assign]
    backend = Backend(
        EngineWorker(engine),
        loaded.tokenizer,
        ServedModel(loaded.name, "1", loaded.config.max_positions),
        HandleVerifier(TrustStore.from_file(keys.folder / "backend-trust.json"), AUDIENCE),
        AttestationSigner(load_private_key(keys.folder / "be.key"), "be", AUDIENCE),
    )
    return create_backend(backend), runner


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{bound_port(runner)}"


@dataclass
class Stack:
    url: str
    keys: Keys
    policy: Path
    session: aiohttp.ClientSession
    gateway: web.Application
    backend_url: str = ""

    @property
    def audit_log(self) -> Path:
        return self.keys.folder / "audit.jsonl"

    def headers(self, tenant: str, **extra: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.keys.api_keys[tenant]}", **extra}

    async def post(
        self, tenant: str, body: dict[str, Any], path: str = "/v1/chat/completions", **extra: str
    ) -> aiohttp.ClientResponse:
        return await self.session.post(
            self.url + path, json=body, headers=self.headers(tenant, **extra)
        )


@asynccontextmanager
async def running_stack(
    backend: web.Application,
    keys: Keys,
    model: str,
    *,
    audit: str = "enforce",
    tenants: dict[str, str] | None = None,
    extra: str = "",
    audit_log: str = "",
) -> AsyncIterator[Stack]:
    backend_runner, backend_url = await serve(backend)
    policy = write_policy(
        keys, backend_url, model, audit=audit, tenants=tenants, extra=extra, audit_log=audit_log
    )
    gateway = create_gateway(load_policy(policy))
    gateway_runner = await start(gateway, "127.0.0.1", 0)
    session = aiohttp.ClientSession()
    try:
        url = f"http://127.0.0.1:{bound_port(gateway_runner)}"
        yield Stack(url, keys, policy, session, gateway, backend_url)
    finally:
        await session.close()
        await gateway_runner.cleanup()
        await backend_runner.cleanup()
