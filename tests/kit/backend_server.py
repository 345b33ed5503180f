"""Builds a real backend app (engine, runner, handle verifier, attestation signer) for HTTP tests,
with a gateway-side key that signs handles the way the gateway does."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from backend.engine.engine import Engine, EngineConfig
from backend.model.load import LoadedModel
from backend.runner import ModelRunner
from backend.service import Backend, ServedModel
from backend.worker import EngineWorker
from kvfence.attestation import AttestationSigner, AttestationVerifier
from kvfence.handle import HANDLE_HEADER, HandleSigner, HandleVerifier
from kvfence.keys.keyfile import TrustStore, generate_key
from tests.kit.leaky_engine import LeakyEngine

AUDIENCE = "backend-test"


@dataclass
class Kit:
    backend: Backend
    signer: HandleSigner  # the gateway's key: the backend trusts it
    attestations: AttestationVerifier
    engine: Engine
    model: str
    revision: str

    def handle(
        self,
        namespace: str,
        *,
        body: bytes,
        model: str | None = None,
        audience: str = AUDIENCE,
        ttl: float = 60.0,
        request_id: str | None = None,
    ) -> str:
        """A handle for exactly `body` (the bytes the request will carry)."""
        return self.signer.sign(
            namespace,
            model or self.model,
            self.revision,
            request_id or uuid.uuid4().hex,
            audience,
            ttl,
            body=body,
        )

    async def post(
        self,
        client: TestClient[Any, Any],
        path: str,
        body: dict[str, Any] | bytes,
        namespace: str,
        **handle: Any,
    ) -> ClientResponse:
        """POST `body` with a handle signed for its exact bytes, as the gateway sends it."""
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        headers = {HANDLE_HEADER: self.handle(namespace, body=raw, **handle)}
        headers["content-type"] = "application/json"
        return await client.post(path, data=raw, headers=headers)


def make_kit(loaded: LoadedModel, *, num_blocks: int = 256, leaky: bool = False) -> Kit:
    """`leaky`: the engine is the test double that maps a foreign block into new requests."""
    gateway_key, backend_key = generate_key(), generate_key()
    trust = TrustStore({"gw": gateway_key.public_key()})
    runner = ModelRunner(loaded, num_blocks=num_blocks, block_size=16)
    engine = (LeakyEngine if leaky else Engine)(
        runner, EngineConfig(num_blocks=num_blocks, block_size=16)
    )
    served = ServedModel(loaded.name, "1", loaded.config.max_positions)
    backend = Backend(
        EngineWorker(engine),
        loaded.tokenizer,
        served,
        HandleVerifier(trust, AUDIENCE),
        AttestationSigner(backend_key, "be", AUDIENCE),
    )
    verifier = AttestationVerifier(TrustStore({"be": backend_key.public_key()}))
    return Kit(backend, HandleSigner(gateway_key, "gw"), verifier, engine, loaded.name, "1")
