"""A handle is bound to the exact body the gateway forwards: a handle captured on the way from
the gateway to our backend, sent before its own request with another prompt, is refused (403
`body_mismatch`) with no answer and no attestation, so it no longer runs an attacker's prompt in
the victim's namespace. The real gateway, the real backend (a tiny model) and, between them, a
tap that records what the gateway sends and can hold it back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from backend.model.load import LoadedModel
from kvfence.attestation import ATTESTATION_HEADER, AttestationVerifier
from kvfence.handle import HANDLE_HEADER
from kvfence.keys.keyfile import TrustStore
from tests.kit.stack import Keys, Stack, make_backend, make_keys, running_stack, serve


@dataclass
class Tap:
    """Between the gateway and the backend: records each request; forwards it, or (hold)
    answers 503 itself, so the captured handle is still unused."""

    backend_url: str
    hold: bool = False
    seen: list[tuple[dict[str, str], bytes]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.seen.append((headers, body))
        if self.hold:
            return web.Response(status=503)
        forward = {k: v for k, v in headers.items() if k not in ("host", "content-length")}
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.backend_url + request.path, data=body, headers=forward) as resp,
        ):
            answer = await resp.read()
            kept = {k: v for k, v in resp.headers.items() if k.lower() != "content-length"}
            return web.Response(body=answer, status=resp.status, headers=kept)


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return make_keys(tmp_path)


@pytest.fixture
async def wired(tiny_model: LoadedModel, keys: Keys) -> AsyncIterator[tuple[Stack, Tap, str]]:
    runner, backend_url = await serve(make_backend(tiny_model, keys))
    tap = Tap(backend_url)
    try:
        async with running_stack(tap.app(), keys, "tiny") as stack:
            yield stack, tap, backend_url
    finally:
        await runner.cleanup()


def completion(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0, **extra}


async def test_a_captured_handle_does_not_run_another_prompt(
    wired: tuple[Stack, Tap, str], keys: Keys
) -> None:
    stack, tap, backend_url = wired
    tap.hold = True
    victim = await stack.post("acme", completion("the victim's prompt " * 4), "/v1/completions")
    assert victim.status in (502, 503)  # held back: the handle was never used
    [(headers, victim_body)] = tap.seen
    captured = headers[HANDLE_HEADER]
    attacker = orjson.dumps(completion("the attacker's own prompt " * 4))
    async with aiohttp.ClientSession() as session:
        url = backend_url + "/v1/completions"
        base = {"content-type": "application/json", HANDLE_HEADER: captured}
        resp = await session.post(url, data=attacker, headers=base)
        assert resp.status == 403
        assert (await resp.json())["error"]["code"] == "body_mismatch"
        assert ATTESTATION_HEADER not in resp.headers
        # The control: the captured handle itself was genuine, for the victim's exact bytes.
        resp = await session.post(url, data=victim_body, headers=base)
        assert resp.status == 200
        trust = TrustStore.from_file(keys.folder / "gateway-trust.json")
        att = AttestationVerifier(trust).verify(resp.headers[ATTESTATION_HEADER])
        assert att.request_id == headers["x-request-id"]


async def test_the_handle_covers_the_bytes_the_gateway_forwards(
    wired: tuple[Stack, Tap, str],
) -> None:
    stack, tap, _ = wired
    big = 18446744073709551615  # 2^64 - 1, which a float would round: forwarded and signed exactly
    resp = await stack.post("acme", completion("hello there", seed=big), "/v1/completions")
    assert resp.status == 200, await resp.text()
    assert resp.headers["x-kvfence-verdict"] == "clean"
    [(_, sent)] = tap.seen
    assert b'"seed":18446744073709551615' in sent
