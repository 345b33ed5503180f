"""The backend over real HTTP on loopback: handles checked before the engine, namespaces that
never share cache, attestations that say which namespaces' blocks a response used."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from backend.model.load import LoadedModel
from backend.server import create_app
from kvfence.attestation import (
    ATTESTATION_EVENT,
    ATTESTATION_FIELD,
    ATTESTATION_HEADER,
    Attestation,
    check_attestation,
)
from kvfence.handle import HANDLE_HEADER, HANDLE_PREFIX, HandleSigner
from kvfence.keys.keyfile import b64url_decode, generate_key
from kvfence.token import sign_token
from kvfence.verdict import Verdict
from tests.kit.backend_server import Kit, make_kit
from tests.kit.polling import until

Client = TestClient[web.Request, web.Application]
MakeClient = Callable[[web.Application], Awaitable[Client]]


@pytest.fixture
async def tiny(aiohttp_client: MakeClient, tiny_model: LoadedModel) -> tuple[Kit, Client]:
    kit = make_kit(tiny_model)
    return kit, await aiohttp_client(create_app(kit.backend))


@pytest.fixture(scope="module")
def smol_kit(smollm2: LoadedModel) -> Callable[..., Kit]:
    return lambda **kw: make_kit(smollm2, **kw)


async def test_requests_without_a_valid_handle_never_reach_the_engine(
    tiny: tuple[Kit, Client],
) -> None:
    kit, client = tiny
    submitted: list[Any] = []
    real_submit = kit.backend.worker.submit

    def spy(*args: Any) -> Any:
        submitted.append(args)
        return real_submit(*args)

    kit.backend.worker.submit = spy  # type: ignore[method-assign]
    body = {"model": kit.model, "prompt": "hello", "max_tokens": 2}
    raw = orjson.dumps(body)
    forged = HandleSigner(generate_key(), "gw").sign(
        "ns-a", kit.model, "1", "r1", "backend-test", body=raw
    )
    stale = HandleSigner(kit.signer._key, "gw", clock=lambda: time.time() - 600)
    other_body = orjson.dumps({**body, "prompt": "another tenant's prompt"})
    cases = [
        ({}, 401, "missing_handle"),
        ({HANDLE_HEADER: "kvh1.garbage"}, 401, "malformed"),
        ({HANDLE_HEADER: forged}, 401, "bad_signature"),
        (
            {HANDLE_HEADER: stale.sign("ns-a", kit.model, "1", "r2", "backend-test", body=raw)},
            401,
            "expired",
        ),
        ({HANDLE_HEADER: _without_body_digest(kit, raw)}, 401, "malformed"),
        (
            {HANDLE_HEADER: kit.handle("ns-a", body=raw, audience="another-backend")},
            403,
            "wrong_audience",
        ),
        ({HANDLE_HEADER: kit.handle("ns-a", body=other_body)}, 403, "body_mismatch"),
        ({HANDLE_HEADER: kit.handle("ns-a", body=raw, model="another-model")}, 403, "wrong_model"),
    ]
    for headers, status, code in cases:
        resp = await client.post("/v1/completions", data=raw, headers=headers)
        assert resp.status == status, (code, await resp.text())
        assert (await resp.json())["error"]["code"] == code
    assert submitted == []

    once = kit.handle("ns-a", body=raw)
    first = await client.post("/v1/completions", data=raw, headers={HANDLE_HEADER: once})
    assert first.status == 200
    replay = await client.post("/v1/completions", data=raw, headers={HANDLE_HEADER: once})
    assert replay.status == 401
    assert (await replay.json())["error"]["code"] == "replayed"
    assert len(submitted) == 1


def _without_body_digest(kit: Kit, raw: bytes) -> str:
    """A genuinely signed handle of the old shape: every claim but the body digest."""
    claims = orjson.loads(b64url_decode(kit.handle("ns-a", body=raw).split(".")[1]))
    del claims["bd"]
    return sign_token(HANDLE_PREFIX, claims, kit.signer._key)


async def test_a_captured_handle_cannot_carry_another_body(tiny: tuple[Kit, Client]) -> None:
    """A handle taken off the wire before its request arrives, sent with the attacker's own
    body, is refused before the body is parsed and never reaches the engine."""
    kit, client = tiny
    submitted: list[Any] = []
    real_submit = kit.backend.worker.submit
    kit.backend.worker.submit = lambda *a: submitted.append(a) or real_submit(*a)  # type: ignore[method-assign]
    victim = orjson.dumps({"model": kit.model, "prompt": "victim", "max_tokens": 1})
    for attack in (
        orjson.dumps({"model": kit.model, "prompt": "attacker", "max_tokens": 1}),
        victim + b" ",  # the same JSON, one byte longer
        victim.replace(b'"max_tokens":1', b'"max_tokens":2'),
        b"",
    ):
        captured = kit.handle("victim-ns", body=victim)
        resp = await client.post("/v1/completions", data=attack, headers={HANDLE_HEADER: captured})
        assert resp.status == 403
        assert (await resp.json())["error"]["code"] == "body_mismatch"
        assert ATTESTATION_HEADER not in resp.headers
    assert submitted == []


async def test_malformed_bodies_get_400_not_a_crash(tiny: tuple[Kit, Client]) -> None:
    kit, client = tiny
    for raw in [
        b"{",
        b"[]",
        b'{"model": 3}',
        b'{"model": "tiny", "prompt": ""}',
        b'{"model": "tiny", "prompt": "x", "max_tokens": -1}',
        b'{"model": "tiny", "messages": [{"role": "user"}]}',
    ]:
        resp = await kit.post(client, "/v1/completions", raw, "ns-a")
        assert resp.status == 400, raw
        assert (await resp.json())["error"]["type"] == "invalid_request_error"


async def test_a_prompt_over_the_pool_is_400_context_length_exceeded(
    aiohttp_client: MakeClient, tiny_model: LoadedModel
) -> None:
    kit = make_kit(tiny_model, num_blocks=4)  # 64 tokens of pool; the context is 256
    client = await aiohttp_client(create_app(kit.backend))
    body = {"model": "tiny", "prompt": "x" * 120, "max_tokens": 1}
    resp = await kit.post(client, "/v1/completions", body, "ns-a")
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == "context_length_exceeded"
    assert not kit.engine.has_work()


async def test_attestation_header_verifies_and_names_the_request(tiny: tuple[Kit, Client]) -> None:
    kit, client = tiny
    body = {"model": kit.model, "prompt": "abc", "max_tokens": 3}
    resp = await kit.post(client, "/v1/completions", body, "ns-a", request_id="req-42")
    assert resp.status == 200
    att = kit.attestations.verify(resp.headers[ATTESTATION_HEADER])
    assert (att.request_id, att.namespace) == ("req-42", "ns-a")
    assert att.block_namespaces == frozenset({"ns-a"})
    assert check_attestation(att, "req-42", "ns-a") == Verdict.CLEAN
    usage = (await resp.json())["usage"]
    assert 1 <= usage["completion_tokens"] <= 3  # a random tiny model may stop early
    assert usage["prompt_tokens_details"]["cached_tokens"] == att.cached_tokens == 0


async def test_client_disconnect_frees_its_blocks_and_logs_no_error(
    tiny: tuple[Kit, Client], caplog: pytest.LogCaptureFixture
) -> None:
    """A client that leaves mid-stream is a normal exit: its blocks are freed, and nothing is
    logged at ERROR (no traceback of the failed write for an operator to chase)."""
    caplog.set_level(logging.INFO)
    kit, client = tiny
    body = {"model": kit.model, "prompt": "x" * 40, "max_tokens": 200, "stream": True}
    resp = await kit.post(client, "/v1/completions", body, "ns-a")
    await resp.content.readline()
    resp.close()

    async def freed() -> bool:
        stats = await kit.backend.worker.call(lambda engine: engine.stats())
        return bool(stats.running == 0 and stats.blocks_used == 0)

    await until(freed, what="the engine freeing the disconnected request's blocks")
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []


def _random_text(words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=5)) for _ in range(words))


async def _complete(
    client: Client, kit: Kit, ns: str, prompt: str
) -> tuple[dict[str, Any], Attestation]:
    body = {"model": kit.model, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    resp = await kit.post(client, "/v1/completions", body, ns)
    assert resp.status == 200, await resp.text()
    return await resp.json(), kit.attestations.verify(resp.headers[ATTESTATION_HEADER])


@pytest.mark.slow
async def test_same_prompt_in_two_namespaces_shares_nothing(
    aiohttp_client: MakeClient, smol_kit: Callable[..., Kit]
) -> None:
    kit = smol_kit()
    client = await aiohttp_client(create_app(kit.backend))
    prompt = _random_text(60, seed=1)
    first, _ = await _complete(client, kit, "tenant-a", prompt)
    again, att_again = await _complete(client, kit, "tenant-a", prompt)
    other, att_other = await _complete(client, kit, "tenant-b", prompt)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # The positive control: the same namespace hits its own cache.
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16
    assert att_again.block_namespaces == frozenset({"tenant-a"})
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert att_other.cached_tokens == 0
    assert att_other.block_namespaces == frozenset({"tenant-b"})


@pytest.mark.slow
async def test_reference_answer_and_streaming_with_the_openai_client(
    aiohttp_client: MakeClient, smol_kit: Callable[..., Kit]
) -> None:
    kit = smol_kit()
    client = await aiohttp_client(create_app(kit.backend))
    question = [{"role": "user", "content": "What is the capital of France?"}]

    def openai(ns: str) -> AsyncOpenAI:
        async def sign(request: Any) -> None:  # a handle for the bytes the client sends
            request.headers[HANDLE_HEADER] = kit.handle(ns, body=request.content)

        return AsyncOpenAI(
            base_url=str(client.make_url("/v1")),
            api_key="unused",
            http_client=DefaultAsyncHttpxClient(event_hooks={"request": [sign]}),
            max_retries=0,
        )

    async with openai("tenant-a") as oa:
        answer = await oa.chat.completions.create(
            model=kit.model,
            messages=question,  # type: ignore[arg-type]
            temperature=0,
            max_tokens=12,
        )
    assert (answer.choices[0].message.content or "").startswith("The capital of France is Paris")
    pieces = []
    async with openai("tenant-a") as oa:
        stream = await oa.chat.completions.create(
            model=kit.model,
            messages=question,  # type: ignore[arg-type]
            temperature=0,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = None
        async for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
            usage = chunk.usage or usage
    assert "".join(pieces) == answer.choices[0].message.content
    assert usage is not None and usage.prompt_tokens_details is not None
    assert (usage.prompt_tokens_details.cached_tokens or 0) > 0  # the same chat prompt again


@pytest.mark.slow
async def test_streaming_sends_the_attestation_before_any_token(
    aiohttp_client: MakeClient, smol_kit: Callable[..., Kit]
) -> None:
    kit = smol_kit()
    client = await aiohttp_client(create_app(kit.backend))
    body = {
        "model": kit.model,
        "stream": True,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    resp = await kit.post(client, "/v1/chat/completions", body, "t-a")
    raw = (await resp.read()).decode()
    events = [e for e in raw.split("\n\n") if e]
    assert events[0].startswith(f"event: {ATTESTATION_EVENT}\ndata: ")
    head = orjson.loads(events[0].split("data: ", 1)[1])
    assert head["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    att = kit.attestations.verify(head[ATTESTATION_FIELD])
    assert att.namespace == "t-a" and att.block_namespaces == frozenset({"t-a"})
    assert events[-1] == "data: [DONE]"


@pytest.mark.slow
async def test_a_leaky_engine_shows_a_foreign_namespace_in_the_attestation(
    aiohttp_client: MakeClient, smol_kit: Callable[..., Kit]
) -> None:
    kit = smol_kit(leaky=True)
    client = await aiohttp_client(create_app(kit.backend))
    await _complete(client, kit, "tenant-a", _random_text(40, seed=2))
    _, att = await _complete(client, kit, "tenant-b", _random_text(40, seed=3))
    assert "tenant-a" in att.block_namespaces
    assert check_attestation(att, att.request_id, "tenant-b") == Verdict.VIOLATION


async def test_ignore_eos_generates_exactly_max_tokens(tiny: tuple[Kit, Client]) -> None:
    kit, client = tiny
    for _ in range(3):  # a random tiny model stops early on its own often enough
        body = {"model": kit.model, "prompt": "abc", "max_tokens": 20, "ignore_eos": True}
        resp = await kit.post(client, "/v1/completions", body, "ns-a")
        assert (await resp.json())["usage"]["completion_tokens"] == 20


async def test_a_temperature_too_small_to_divide_by_draws_greedily_and_the_engine_goes_on(
    tiny: tuple[Kit, Client],
) -> None:
    """A positive temperature under float32's range (any the API accepts) is drawn as the
    greedy answer, not a failed step for every sequence in the batch."""
    kit, client = tiny

    async def text(**sampling: Any) -> tuple[int, str]:
        body = {"model": kit.model, "prompt": "abc", "max_tokens": 8, **sampling}
        resp = await kit.post(client, "/v1/completions", body, "ns-a")
        return resp.status, (await resp.json())["choices"][0]["text"]

    greedy = await text(temperature=0)
    for tiny_t in (1e-40, 5e-324):
        assert await text(temperature=tiny_t) == greedy
        assert await text(temperature=tiny_t, top_p=0.5, seed=3) == greedy
    assert await text(temperature=0) == greedy  # the engine still serves


async def test_admin_flush_needs_an_admin_handle_and_drops_one_namespace(
    tiny: tuple[Kit, Client],
) -> None:
    kit, client = tiny
    prompt = "the same long prompt " * 4

    async def cached(ns: str) -> int:
        body = {"model": kit.model, "prompt": prompt, "max_tokens": 1}
        resp = await kit.post(client, "/v1/completions", body, ns)
        return int((await resp.json())["usage"]["prompt_tokens_details"]["cached_tokens"])

    for ns in ("ns-a", "ns-b"):
        assert await cached(ns) == 0
        assert await cached(ns) > 0
    plain = await client.post("/admin/flush", headers={HANDLE_HEADER: kit.handle("ns-a", body=b"")})
    assert plain.status == 403  # a request handle is never an admin handle
    assert (await client.post("/admin/flush")).status == 401
    admin = kit.signer.sign_admin("flush", "ns-a", "flush-1", "backend-test")
    resp = await client.post("/admin/flush", headers={HANDLE_HEADER: admin})
    assert resp.status == 200 and (await resp.json())["flushed_blocks"] > 0
    assert await cached("ns-a") == 0
    assert await cached("ns-b") > 0
