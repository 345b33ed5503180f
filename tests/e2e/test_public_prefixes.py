"""End to end, public prefixes and scope `request`: the real gateway in front of the real backend
serving SmolLM2 over loopback. A declared system prompt is shared, and nothing after it; a
tenant's own public mark shares only with itself; the attestation says which blocks came from
where; public blocks have a capacity group of their own with a floor; a request-scoped namespace
reuses nothing and leaves only zeroed blocks behind."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import torch
from aiohttp import web

from backend.engine.engine import Engine, EngineStats
from backend.model.load import LoadedModel
from backend.runner import ModelRunner
from backend.server import BACKEND
from kvfence.attestation import ATTESTATION_HEADER, AttestationVerifier
from kvfence.handle import HANDLE_HEADER, HandleSigner
from kvfence.keys.keyfile import TrustStore, generate_key, load_private_key
from kvfence.namespace import NamespaceKey, derive_namespace, public_namespace
from kvfence.public import PUBLIC_GROUP, PublicPart, chat_digest
from kvfence.share import Share
from tests.kit.polling import until
from tests.kit.stack import (
    AUDIENCE,
    Keys,
    Stack,
    backend_and_runner,
    make_backend,
    make_keys,
    running_stack,
)

pytestmark = pytest.mark.slow

BS = 16  # the stack's block size
SYSTEM = (
    "You are the support assistant of Northwind Books. Answer in two sentences at most, "
    "name the store policy you relied on, and never promise a delivery date. The policies "
    "cover orders, returns within thirty days, gift cards, loyalty points and shipping abroad."
)
SECRET = (
    "You are Acme's internal pricing assistant. Our floor margin is eleven percent, the "
    "spring discount code is KESTREL-42, and the Globex contract renews in March at list price."
)
NS_KEY = NamespaceKey("ns1", b"n" * 40)


def public_section(floor: float = 0.25, ceiling: float = 0.5) -> str:
    return (
        f"public:\n  cache: {{ceiling: {ceiling}, floor: {floor}}}\n"
        f'  prefixes:\n    - {{name: northwind, model: smollm2, text: "{SYSTEM}"}}\n'
    )


def chat(system: str, question: str, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return {"model": "smollm2", "messages": messages, "max_tokens": 2, "temperature": 0, **extra}


async def ask(stack: Stack, tenant: str, body: dict[str, Any], **headers: str) -> int:
    """Cached tokens of a clean answer."""
    resp = await stack.post(tenant, body, **headers)
    assert resp.status == 200, await resp.text()
    assert resp.headers["x-kvfence-verdict"] == "clean"
    return int((await resp.json())["usage"]["prompt_tokens_details"]["cached_tokens"])


def records(stack: Stack) -> list[dict[str, Any]]:
    rows = map(orjson.loads, stack.audit_log.read_bytes().splitlines())
    return [r for r in rows if r.get("kind") == "record" and r.get("phase") != "open"]


async def engine_stats(app: web.Application) -> EngineStats:
    stats: EngineStats = await app[BACKEND].worker.call(Engine.stats)
    return stats


@pytest.fixture
def keys(tmp_path: Any) -> Keys:
    return make_keys(tmp_path)


@pytest.fixture
async def stack(smollm2: LoadedModel, keys: Keys) -> AsyncIterator[Stack]:
    settings = {"globex": "scope: user, public: {own: true}"}
    backend = make_backend(smollm2, keys)
    async with running_stack(
        backend, keys, smollm2.name, tenants=settings, extra=public_section()
    ) as s:
        yield s


async def test_two_tenants_share_the_declared_prompt_and_nothing_after_it(stack: Stack) -> None:
    acme_body = chat(SYSTEM, "Can I return a book I bought five weeks ago?")
    assert await ask(stack, "acme", acme_body) == 0
    public = records(stack)[-1]["public_blocks"]
    assert public >= 3  # the declared prompt fills several whole blocks
    globex_body = chat(SYSTEM, "Do gift cards expire?", user="u1")
    assert await ask(stack, "globex", globex_body) == public * BS
    # globex sends acme's whole prompt: only the public blocks are shared, never acme's suffix
    assert await ask(stack, "globex", {**acme_body, "user": "u2"}) == public * BS
    assert await ask(stack, "acme", acme_body) > public * BS  # acme's own suffix is its own
    logged = records(stack)
    assert [(r["verdict"], r["public_blocks"]) for r in logged] == [("clean", public)] * 4
    assert all(r["foreign_namespaces"] == [] for r in logged)


async def test_a_marked_guess_of_another_tenants_prompt_gets_no_hit(stack: Stack) -> None:
    acme_body = chat(SECRET, "What is the spring code?")
    assert await ask(stack, "acme", acme_body) == 0
    assert await ask(stack, "acme", acme_body) > 0
    mark = {"x-kvfence-public-messages": "1"}
    guess = {**acme_body, "user": "u1"}
    assert await ask(stack, "globex", guess, **mark) == 0  # globex's own public namespace
    marked = records(stack)[-1]["public_blocks"]
    assert marked >= 2
    # Its other users read what globex marked, and only that.
    again = chat(SECRET, "Another question entirely.", user="u2")
    assert await ask(stack, "globex", again, **mark) == marked * BS
    resp = await stack.post("acme", acme_body, **mark)  # acme did not opt in
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == "public_mark_refused"


def backend_body(system: str, question: str) -> bytes:
    return orjson.dumps(chat(system, question))


def signed(
    keys: Keys, body: bytes, rid: str, public: tuple[PublicPart, ...], *, forged: bool = False
) -> str:
    key = generate_key() if forged else load_private_key(keys.folder / "gateway.key")
    ns = derive_namespace(NS_KEY, "acme", "tenant", "", "smollm2", "1")
    return HandleSigner(key, "gateway").sign(
        ns, "smollm2", "1", rid, AUDIENCE, body=body, public=public
    )


async def test_the_attestation_names_each_blocks_namespace_and_forgeries_are_refused(
    smollm2: LoadedModel, keys: Keys
) -> None:
    pub = public_namespace(NS_KEY, "smollm2", "1")
    own = derive_namespace(NS_KEY, "acme", "tenant", "", "smollm2", "1")
    share = Share(PUBLIC_GROUP, 0.5, 0.25)
    part = PublicPart(pub, 1, len(SYSTEM), chat_digest([("system", SYSTEM)]), share)
    verifier = AttestationVerifier(
        TrustStore.from_file(keys.folder / "gateway-trust.json"), AUDIENCE
    )
    async with running_stack(make_backend(smollm2, keys), keys, smollm2.name) as stack:
        url = stack.backend_url + "/v1/chat/completions"

        async def post(body: bytes, handle: str) -> tuple[int, dict[str, Any], str | None]:
            headers = {HANDLE_HEADER: handle, "content-type": "application/json"}
            async with stack.session.post(url, data=body, headers=headers) as resp:
                return resp.status, await resp.json(), resp.headers.get(ATTESTATION_HEADER)

        body = backend_body(SYSTEM, "Where do you ship?")
        status, _, token = await post(body, signed(keys, body, "r-1", (part,)))
        assert status == 200 and token is not None
        att = verifier.verify(token)
        assert att.block_namespaces == {pub, own}
        (first, public), (second, rest) = att.block_runs
        assert (first, second) == (pub, own) and public >= 3 and rest >= 1
        assert public + rest == -(-att.prompt_tokens // BS)  # every block of the prompt
        # A handle from a key the backend does not trust: refused before the engine.
        status, error, token = await post(body, signed(keys, body, "r-2", (part,), forged=True))
        assert status == 401 and token is None and error["error"]["code"] == "bad_signature"
        # A genuine handle cannot make other content public: the digest must match the body.
        other = backend_body(SECRET, "Where do you ship?")
        status, error, token = await post(other, signed(keys, other, "r-3", (part,)))
        assert status == 403 and token is None and error["error"]["code"] == "public_mismatch"


async def test_a_tenant_the_policy_keeps_off_public_prefixes_shares_nothing(
    smollm2: LoadedModel, keys: Keys
) -> None:
    settings = {"globex": "scope: tenant, public: {declared: false}"}
    backend = make_backend(smollm2, keys)
    async with running_stack(
        backend, keys, smollm2.name, tenants=settings, extra=public_section()
    ) as stack:
        assert await ask(stack, "acme", chat(SYSTEM, "Hi")) == 0
        assert await ask(stack, "globex", chat(SYSTEM, "Hi")) == 0
        assert [r["public_blocks"] for r in records(stack)][1] == 0


@pytest.mark.parametrize("floor", [0.25, 0.0])
async def test_public_blocks_sit_outside_tenant_ceilings_and_keep_their_floor(
    smollm2: LoadedModel, keys: Keys, floor: float
) -> None:
    blocks = 64
    settings = {
        "acme": "scope: tenant, cache: {ceiling: 0.15, floor: 0.0}",  # 9 blocks of 64
        "globex": "scope: tenant, cache: {ceiling: 1.0, floor: 0.0}",
    }
    backend = make_backend(smollm2, keys, blocks=blocks)
    async with running_stack(
        backend, keys, smollm2.name, tenants=settings, extra=public_section(floor)
    ) as stack:
        question = "Please explain the loyalty points programme in detail. " * 10
        assert await ask(stack, "acme", chat(SYSTEM, question)) == 0
        first = records(stack)[-1]
        public = first["public_blocks"]
        assert -(-first["prompt_tokens"] // BS) > 9  # more blocks than acme's ceiling
        held = (await engine_stats(backend)).group_blocks
        assert held.pop(PUBLIC_GROUP)[0] == public  # counted in their own group
        assert 0 < max(n for n, _ in held.values()) <= 9
        # The same length without the public prefix does not fit acme's ceiling.
        undeclared = SYSTEM.replace("You are", "We are", 1)
        resp = await stack.post("acme", chat(undeclared, question))
        assert resp.status == 400
        # globex floods the pool with prompts of its own; the public prefix keeps its floor.
        for n in range(8):  # about 11 blocks each: more than the whole pool
            flood = f"Flood {n}: " + "numbers and letters in a long line " * 22
            assert await ask(stack, "globex", chat(flood, "go")) == 0
        later = await ask(stack, "acme", chat(SYSTEM, "Is shipping abroad possible?"))
        assert later == (public * BS if floor else 0)


async def test_scope_request_never_hits_and_leaves_only_zeroed_blocks(
    smollm2: LoadedModel, keys: Keys
) -> None:
    app, runner = backend_and_runner(smollm2, keys, blocks=64)
    settings = {"globex": "scope: request"}
    async with running_stack(
        app, keys, smollm2.name, tenants=settings, extra=public_section()
    ) as stack:
        body = chat(SYSTEM, "Can I pay with loyalty points?")
        for _ in range(3):
            assert await ask(stack, "globex", body) == 0
        logged = records(stack)
        assert len({r["namespace"] for r in logged}) == 3  # each request its own namespace
        assert [r["public_blocks"] for r in logged] == [0, 0, 0]

        async def scrubbed() -> bool:
            stats = await engine_stats(app)
            idle = stats.blocks_used == 0 and stats.blocks_cached == 0
            return idle and bool(await app[BACKEND].worker.call(lambda _: kv_zero(runner)))

        await until(scrubbed, what="every block the requests used is zeroed")


def kv_zero(runner: ModelRunner) -> bool:
    caches = [*runner.k_cache, *runner.v_cache]
    return all(not torch.any(c).item() for c in caches)


async def test_each_of_n_choices_starts_on_the_public_prefix_and_scope_request_scrubs_them(
    smollm2: LoadedModel, keys: Keys
) -> None:
    """n=2 with a declared prefix: both choices' sequences get the public segment (their block
    runs agree, or the attestation would carry none and not be clean), logprobs come back for
    each, and the one attestation's runs show the public blocks, counted once for the prompt.
    A request-scoped tenant's two choices leave only zeroed blocks behind."""
    app, runner = backend_and_runner(smollm2, keys, blocks=64)
    settings = {"acme": "scope: tenant", "globex": "scope: request"}
    async with running_stack(
        app, keys, smollm2.name, tenants=settings, extra=public_section()
    ) as stack:
        assert await ask(stack, "globex", chat(SYSTEM, "Do gift cards expire?", n=2)) == 0
        assert records(stack)[-1]["public_blocks"] == 0  # scope request shares nothing

        async def scrubbed() -> bool:
            stats = await engine_stats(app)
            idle = stats.blocks_used == 0 and stats.blocks_cached == 0
            return idle and bool(await app[BACKEND].worker.call(lambda _: kv_zero(runner)))

        await until(scrubbed, what="both choices' blocks are freed and zeroed")
        body = chat(SYSTEM, "Do gift cards expire?", n=2, logprobs=True, top_logprobs=2)
        resp = await stack.post("acme", body)
        assert resp.status == 200 and resp.headers["x-kvfence-verdict"] == "clean"
        answer = await resp.json()
        choices = answer["choices"]
        assert [c["index"] for c in choices] == [0, 1]
        assert choices[0]["message"] == choices[1]["message"]  # greedy: the same answer
        entries = [e for c in choices for e in c["logprobs"]["content"]]
        assert len(entries) == answer["usage"]["completion_tokens"] >= 2
        assert all(e["logprob"] <= 0 and len(e["top_logprobs"]) == 2 for e in entries)
        public = records(stack)[-1]["public_blocks"]
        assert public >= 3
        own = derive_namespace(NS_KEY, "acme", "tenant", "", "smollm2", "1")
        pub = public_namespace(NS_KEY, "smollm2", "1")
        share = Share(PUBLIC_GROUP, 0.5, 0.25)
        part = PublicPart(pub, 1, len(SYSTEM), chat_digest([("system", SYSTEM)]), share)
        raw = orjson.dumps(chat(SYSTEM, "Where do you ship?", n=2))
        headers = {HANDLE_HEADER: signed(keys, raw, "r-n2", (part,))}
        async with stack.session.post(
            stack.backend_url + "/v1/chat/completions", data=raw, headers=headers
        ) as direct:
            assert direct.status == 200 and len((await direct.json())["choices"]) == 2
            token = direct.headers[ATTESTATION_HEADER]
        trust = TrustStore.from_file(keys.folder / "gateway-trust.json")
        att = AttestationVerifier(trust, AUDIENCE).verify(token)
        assert att.block_namespaces == {pub, own}
        assert att.cached_tokens == public * BS  # acme's public blocks, read by both choices
        (first, runs), (second, rest) = att.block_runs
        assert (first, second, runs) == (pub, own, public)
        assert runs + rest == -(-att.prompt_tokens // BS)  # the prompt's blocks, counted once
