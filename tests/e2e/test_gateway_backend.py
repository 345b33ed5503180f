"""End to end: the real gateway in front of the real backend serving SmolLM2, over loopback,
configured from files on disk. Tenants share nothing; a foreign block never reaches a client
under enforce; every verdict lands in an audit log that verifies."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import orjson
import pytest

from backend.model.load import LoadedModel
from kvfence.cli import main as kvfence_main
from kvfence.handle import HandleSigner
from kvfence.keys.keyfile import load_private_key
from kvfence.namespace import NamespaceKey, derive_namespace
from tests.kit.concurrent_sessions import alone_then_together
from tests.kit.stack import AUDIENCE, Keys, Stack, make_backend, make_keys, running_stack

pytestmark = pytest.mark.slow

LONG = (
    "You are a careful assistant for a shipping company. Answer briefly and cite the policy "
    "section you relied on. The policy covers parcels, pallets, customs forms and refunds. "
) * 3


def chat(text: str = LONG, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": text}]
    return {"model": "smollm2", "messages": messages, "max_tokens": 3, "temperature": 0, **extra}


async def cached_of(
    stack: Stack,
    tenant: str,
    body: dict[str, Any],
    path: str = "/v1/chat/completions",
    **headers: str,
) -> int:
    resp = await stack.post(tenant, body, path, **headers)
    assert resp.status == 200, await resp.text()
    assert resp.headers["x-kvfence-verdict"] == "clean"
    return int((await resp.json())["usage"]["prompt_tokens_details"]["cached_tokens"])


def records(stack: Stack) -> list[dict[str, Any]]:
    rows = map(orjson.loads, stack.audit_log.read_bytes().splitlines())
    return [r for r in rows if r.get("kind") == "record" and r.get("phase") != "open"]


def log_verifies(stack: Stack) -> bool:
    key = str(stack.keys.audit_key_file)
    return kvfence_main(["audit", "verify", str(stack.audit_log), "--key-file", key]) == 0


@pytest.fixture
def keys(tmp_path: Any) -> Keys:
    return make_keys(tmp_path)


@pytest.fixture
async def stack(smollm2: LoadedModel, keys: Keys) -> AsyncIterator[Stack]:
    async with running_stack(make_backend(smollm2, keys), keys, smollm2.name) as s:
        yield s


async def test_a_tenant_reuses_its_cache_and_another_tenant_does_not(stack: Stack) -> None:
    assert await cached_of(stack, "acme", chat()) == 0
    assert await cached_of(stack, "acme", chat()) > 0
    assert await cached_of(stack, "globex", chat()) == 0
    assert [r["verdict"] for r in records(stack)] == ["clean"] * 3
    assert log_verifies(stack)


async def test_no_client_input_reaches_another_tenants_cache(stack: Stack, keys: Keys) -> None:
    acme_ns = derive_namespace(NamespaceKey("ns1", b"n" * 40), "acme", "tenant", "", "smollm2", "1")
    gateway_key = load_private_key(keys.folder / "gateway.key")
    # A genuine handle for acme's namespace (as if it leaked), and one from a forged key.
    leaked = HandleSigner(gateway_key, "gateway").sign(
        acme_ns, "smollm2", "1", "r-1", AUDIENCE, body=b"{}"
    )
    forged = HandleSigner(load_private_key(keys.folder / "be.key"), "gateway").sign(
        acme_ns, "smollm2", "1", "r-2", AUDIENCE, body=b"{}"
    )
    attempts: list[tuple[dict[str, Any], dict[str, str]]] = [
        (chat(cache_salt=acme_ns), {}),
        (chat(extra_key=acme_ns), {}),
        (chat(), {"x-kvfence-handle": leaked}),
        (chat(), {"x-kvfence-handle": leaked}),  # the same handle replayed
        (chat(), {"x-kvfence-handle": forged}),
        (chat(), {"x-tenant-id": "acme", "x-kvfence-namespace": acme_ns, "x-cache-salt": acme_ns}),
        (chat(user="acme", prompt_cache_key=acme_ns), {}),
    ]
    done = "/v1/completions"  # no chat template: the prompts share no prefix at all
    for number, (body, headers) in enumerate(attempts):
        # A prompt only acme has sent (globex caches its own copy with every attempt).
        del body["messages"]
        body["prompt"] = prompt = f"Case {number}. {LONG}"
        plain = {"model": "smollm2", "prompt": prompt, "max_tokens": 2}
        assert await cached_of(stack, "acme", plain, path=done) == 0
        assert await cached_of(stack, "acme", plain, path=done) > 0
        got = await cached_of(stack, "globex", body, path=done, **headers)
        assert got == 0, (sorted(body), sorted(headers))
    # Dynamo's container of a salt is no field our backend takes: refused, naming it, never
    # forwarded (and never dropped silently).
    body = {"model": "smollm2", "prompt": f"Case nvext. {LONG}", "max_tokens": 2,
            "nvext": {"cache_salt": acme_ns}}  # fmt: skip
    resp = await stack.post("globex", body, done)
    error = (await resp.json())["error"]
    assert resp.status == 400 and (error["code"], error["param"]) == ("unknown_field", "nvext")


async def test_a_foreign_block_is_blocked_before_any_token(
    smollm2: LoadedModel, keys: Keys
) -> None:
    backend = make_backend(smollm2, keys, leaky=True)
    async with running_stack(backend, keys, smollm2.name) as stack:
        await cached_of(stack, "acme", chat())
        resp = await stack.post("globex", chat("Tell me about pallets and customs. " * 4))
        assert resp.status == 502 and resp.headers["x-kvfence-verdict"] == "violation"
        assert "choices" not in await resp.json()
        streamed = await stack.post("globex", chat("What of refunds? " * 8, stream=True))
        assert streamed.status == 502
        assert b"data:" not in await streamed.read()
        logged = records(stack)
        assert [(r["verdict"], r["blocked"]) for r in logged] == [
            ("clean", False),
            ("violation", True),
            ("violation", True),
        ]
        assert log_verifies(stack)


async def test_a_foreign_block_in_one_of_n_choices_blocks_the_whole_answer(
    smollm2: LoadedModel, keys: Keys
) -> None:
    """Only the last choice's sequence gets the foreign block; the answer's one attestation
    names it, so the gateway withholds every choice, streamed or not."""
    last_choices = {4, 7}  # acme's request is sequence 1; globex's choices are 2-4, then 5-7
    backend = make_backend(
        smollm2, keys, leaky=True, leak_into=lambda seq: seq.seq_id in last_choices
    )
    async with running_stack(backend, keys, smollm2.name) as stack:
        await cached_of(stack, "acme", chat())
        resp = await stack.post("globex", chat("Tell me about pallets and customs. " * 4, n=3))
        assert resp.status == 502 and resp.headers["x-kvfence-verdict"] == "violation"
        assert "choices" not in await resp.json()
        streamed = await stack.post("globex", chat("What of refunds? " * 8, n=3, stream=True))
        assert streamed.status == 502
        assert b"data:" not in await streamed.read()
        assert [r["verdict"] for r in records(stack)] == ["clean", "violation", "violation"]


async def test_monitor_mode_lets_the_violation_through_and_logs_it(
    smollm2: LoadedModel, keys: Keys
) -> None:
    backend = make_backend(smollm2, keys, leaky=True)
    async with running_stack(backend, keys, smollm2.name, audit="monitor") as stack:
        await cached_of(stack, "acme", chat())
        resp = await stack.post("globex", chat("Tell me about pallets and customs. " * 4))
        assert resp.status == 200 and resp.headers["x-kvfence-verdict"] == "violation"
        assert (await resp.json())["choices"][0]["message"]["content"]
        assert records(stack)[-1]["verdict"] == "violation"
        assert log_verifies(stack)


async def test_the_openai_client_through_the_gateway(stack: Stack) -> None:
    client = openai.AsyncOpenAI(
        base_url=stack.url + "/v1", api_key=stack.keys.api_keys["acme"], max_retries=0
    )
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model="smollm2", messages=[{"role": "user", "content": "Say hi."}], max_tokens=4
        )
        assert raw.headers["x-kvfence-verdict"] == "clean"
        answer = raw.parse()
        assert answer.choices[0].message.content
        stream = await client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "Say hi."}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text and chunks[-1].usage is not None
        assert chunks[-1].usage.prompt_tokens > 0
    finally:
        await client.close()
    assert [r["verdict"] for r in records(stack)] == ["clean", "clean"]


async def test_paths_our_backend_does_not_serve_fail_at_once_naming_those_it_does(
    stack: Stack,
) -> None:
    """The `openai` client's responses and embeddings calls get a 404 (no retries), never a
    5xx: the message names the paths our backend serves."""
    client = openai.AsyncOpenAI(
        base_url=stack.url + "/v1", api_key=stack.keys.api_keys["acme"], max_retries=2
    )
    try:
        for call in (
            client.responses.create(model="smollm2", input="Say hi."),
            client.embeddings.create(model="smollm2", input="Say hi."),
        ):
            with pytest.raises(openai.NotFoundError) as caught:
                await call
            assert caught.value.code == "path_not_served"
            assert "/v1/chat/completions, /v1/completions" in caught.value.message
    finally:
        await client.close()
    assert records(stack) == []  # nothing reached the backend


async def test_logprobs_and_n_through_the_gateway_with_the_openai_client(stack: Stack) -> None:
    """The gateway passes n, logprobs and top_logprobs on, judges the one attestation of a
    several-choice answer clean, and relays the backend's refusal naming the parameter."""
    client = openai.AsyncOpenAI(
        base_url=stack.url + "/v1", api_key=stack.keys.api_keys["acme"], max_retries=0
    )
    question: Any = [{"role": "user", "content": "What is the capital of France?"}]
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model="smollm2",
            messages=question,
            max_tokens=8,
            temperature=0,
            n=2,
            logprobs=True,
            top_logprobs=3,
        )
        assert raw.headers["x-kvfence-verdict"] == "clean"
        answer = raw.parse()
        assert [c.index for c in answer.choices] == [0, 1]
        first, second = answer.choices
        assert (first.message.content or "").startswith("The capital of France is")
        assert second.message == first.message  # greedy choices are identical
        assert first.logprobs is not None and first.logprobs.content is not None
        entries = first.logprobs.content
        assert answer.usage is not None and answer.usage.completion_tokens == 2 * len(entries)
        for entry in entries:
            assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
            assert (entry.token, entry.logprob) == (
                entry.top_logprobs[0].token,
                entry.top_logprobs[0].logprob,
            )
        stream = await client.chat.completions.create(
            model="smollm2",
            messages=question,
            max_tokens=6,
            temperature=1.2,
            seed=5,
            n=3,
            logprobs=True,
            stream=True,
            stream_options={"include_usage": True},
        )
        counted = {0: 0, 1: 0, 2: 0}
        usage = None
        async for chunk in stream:
            for choice in chunk.choices:
                counted[choice.index] += (
                    len(choice.logprobs.content or []) if choice.logprobs else 0
                )
            usage = chunk.usage or usage
        assert usage is not None and sum(counted.values()) == usage.completion_tokens
        assert all(counted.values())
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model="smollm2",
                messages=question,
                tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
            )
        assert refused.value.param == "tools"
    finally:
        await client.close()
    assert [r["verdict"] for r in records(stack)] == ["clean", "clean", "unattested"]
    assert log_verifies(stack)


async def test_two_concurrent_sessions_share_batches_and_nothing_else(stack: Stack) -> None:
    async def post(tenant: str, body: dict[str, Any]) -> Any:
        return await stack.post(tenant, body)

    alone, together, secret = await alone_then_together(post, "smollm2", ("acme", "globex"))
    assert [a.text for a in together] == [a.text for a in alone]  # batched == alone, greedy
    for got in (*alone, *together):
        assert (got.status, got.verdict) == (200, "clean"), got
        other = secret["globex" if got.tenant == "acme" else "acme"]
        assert other not in got.text
    assert {r["verdict"] for r in records(stack)} == {"clean"}
