"""Nothing a client sends can pick a namespace: the upstream sees exactly one salt, ours."""

from typing import Any

import pytest
from multidict import CIMultiDict

from gateway.policy.runtime import Runtime
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import KEYS, Gateway, make_policy, run_gateway

MSG = [{"role": "user", "content": "hi"}]


async def expected_salt(gw: Gateway, tenant: str, scope_value: str = "") -> str:
    runtime = Runtime(make_policy(gw.upstream.url))
    route = runtime.routes["smollm2"][0]
    tenant_obj = next(t for t in runtime.policy.tenants if t.id == tenant)
    return runtime.namespace(tenant_obj, scope_value, route)


BODY_CASES: list[dict[str, Any]] = [
    {"cache_salt": "evil"},
    {"CACHE_SALT": "evil"},
    {"Cache-Salt": "evil"},
    {"cache-salt": "evil", "cache_salt": "evil2"},
    {"extra_key": "evil"},
    {"Extra-Key": "evil"},
]
NVEXT_CASES: list[dict[str, Any]] = [
    {"nvext": {"cache_salt": "evil", "keep": 1}},
    {"NVEXT": {"Cache_Salt": "evil"}},
]


@pytest.mark.parametrize("fields", BODY_CASES)
async def test_body_fields_are_stripped(gw: Gateway, fields: dict[str, Any]) -> None:
    resp = await gw.chat("acme", {"model": "smollm2", "messages": MSG, **fields})
    assert resp.status == 200
    sent = gw.upstream.received[-1].json
    salts = [k for k in sent if k.lower().replace("-", "_") in {"cache_salt", "extra_key"}]
    assert salts == ["cache_salt"]
    assert sent["cache_salt"] == await expected_salt(gw, "acme")
    assert b"evil" not in gw.upstream.received[-1].body
    assert not {k.lower() for k in sent} & {"nvext", "cache-salt", "extra-key"}


@pytest.mark.parametrize("fields", NVEXT_CASES)
async def test_a_scoping_field_inside_another_kinds_object_is_stripped_then_refused(
    gw: Gateway, fields: dict[str, Any]
) -> None:
    # nvext is Dynamo's, not vLLM's: scrubbing takes the salt out, and what is left of the
    # object is a field the gateway does not know for vLLM, refused with its name
    resp = await gw.chat("acme", {"model": "smollm2", "messages": MSG, **fields})
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert (error["code"], error["param"]) == ("unknown_field", next(iter(fields)))
    assert gw.upstream.received == []


async def test_duplicate_json_keys_reach_upstream_once(gw: Gateway) -> None:
    raw = (
        b'{"model": "smollm2", "messages": [], "cache_salt": "evil", '
        b'"cache_salt": "evil2", "model": "smollm2"}'
    )
    resp = await gw.session.post(
        gw.url + "/v1/chat/completions",
        data=raw,
        headers={**gw.auth("acme"), "content-type": "application/json"},
    )
    assert resp.status == 200
    body = gw.upstream.received[-1].body
    assert body.count(b'"cache_salt"') == 1 and body.count(b'"model"') == 1
    assert b"evil" not in body


HEADER_CASES = [
    [("x-tenant-id", "evil")],
    [("X-Tenant-Id", "evil"), ("x-tenant-id", "evil2")],
    [("x_tenant_id", "evil")],
    [("X-Cache-Salt", "evil")],
    [("x_cache_salt", "evil")],
    [("X-Kvfence-Handle", "evil")],
]


@pytest.mark.parametrize("headers", HEADER_CASES)
async def test_scoping_headers_never_reach_upstream(
    gw: Gateway, headers: list[tuple[str, str]]
) -> None:
    all_headers = [*gw.auth("acme").items(), *headers]
    resp = await gw.session.post(
        gw.url + "/v1/chat/completions",
        json={"model": "smollm2", "messages": MSG},
        headers=CIMultiDict(all_headers),
    )
    assert resp.status == 200
    got = gw.upstream.received[-1]
    assert all(v not in {"evil", "evil2"} for _, v in got.headers)
    assert got.header_values("authorization") == []  # the tenant's key stays at the gateway
    assert got.json["cache_salt"] == await expected_salt(gw, "acme")


async def test_reject_mode_answers_400(upstream: FakeUpstream) -> None:
    gw, runner = await run_gateway(make_policy(upstream.url, mode="reject"), upstream)
    try:
        resp = await gw.chat("acme", {"model": "smollm2", "messages": MSG, "cache_salt": "x"})
        assert resp.status == 400
        assert (await resp.json())["error"]["code"] == "cache_scoping_input_rejected"
        resp = await gw.chat("acme", {"model": "smollm2", "messages": MSG}, **{"X-Tenant-Id": "x"})
        assert resp.status == 400
        resp = await gw.chat("acme", {"model": "smollm2", "messages": MSG})
        assert resp.status == 200
        assert len(upstream.received) == 1
    finally:
        await gw.session.close()
        await runner.cleanup()


async def test_reject_mode_covers_prompt_cache_key_except_as_a_session_id(
    upstream: FakeUpstream,
) -> None:
    gw, runner = await run_gateway(make_policy(upstream.url, mode="reject"), upstream)
    try:
        body = {"model": "smollm2", "messages": MSG, "prompt_cache_key": "k1"}
        resp = await gw.chat("acme", body)  # scope tenant: a client's own cache key is refused
        assert resp.status == 400
        assert "prompt_cache_key" in (await resp.json())["error"]["message"]
        resp = await gw.chat("initech", {**body, "user": "alice"})  # scope user: refused too
        assert resp.status == 400
        resp = await gw.chat("umbrella", body)  # scope session: it is the session id
        assert resp.status == 200
        resp = await gw.chat("umbrella", {**body, "Prompt-Cache-Key": "k2"})  # another copy
        assert resp.status == 400
        assert len(upstream.received) == 1
        assert "prompt_cache_key" not in upstream.received[0].json
    finally:
        await gw.session.close()
        await runner.cleanup()


async def test_two_tenants_get_different_salts(gw: Gateway) -> None:
    await gw.chat("acme", {"model": "smollm2", "messages": MSG, "cache_salt": "same"})
    await gw.chat("globex", {"model": "smollm2", "messages": MSG, "cache_salt": "same"})
    a, b = (r.json["cache_salt"] for r in gw.upstream.received)
    assert a != b and a.startswith("ns1.") and b.startswith("ns1.")


async def test_prompt_cache_key_is_removed_for_tenant_scope(gw: Gateway) -> None:
    await gw.chat("acme", {"model": "smollm2", "messages": MSG, "prompt_cache_key": "k1"})
    await gw.chat("acme", {"model": "smollm2", "messages": MSG, "prompt_cache_key": "k2"})
    first, second = (r.json for r in gw.upstream.received)
    assert "prompt_cache_key" not in first
    assert first["cache_salt"] == second["cache_salt"]


async def test_session_scope_narrows_by_prompt_cache_key(gw: Gateway) -> None:
    for key in ("s1", "s1", "s2"):
        resp = await gw.chat(
            "umbrella", {"model": "smollm2", "messages": MSG, "prompt_cache_key": key}
        )
        assert resp.status == 200
    s1, s1b, s2 = (r.json for r in gw.upstream.received)
    assert s1["cache_salt"] == s1b["cache_salt"] != s2["cache_salt"]
    assert "prompt_cache_key" not in s1
    assert s1["cache_salt"] == await expected_salt(gw, "umbrella", "s1")
    resp = await gw.chat("umbrella", {"model": "smollm2", "messages": MSG})
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == "missing_scope_value"


async def test_user_scope_from_body_or_policy_header(gw: Gateway) -> None:
    await gw.chat("initech", {"model": "smollm2", "messages": MSG, "user": "alice"})
    await gw.chat("initech", {"model": "smollm2", "messages": MSG}, **{"x-end-user": "alice"})
    await gw.chat("initech", {"model": "smollm2", "messages": MSG, "user": "bob"})
    alice, alice2, bob = (r.json["cache_salt"] for r in gw.upstream.received)
    assert alice == alice2 == await expected_salt(gw, "initech", "alice")
    assert bob != alice
    assert KEYS["initech"] not in str(gw.upstream.received[-1].headers)


async def test_upstream_cookies_never_reach_another_request(upstream: FakeUpstream) -> None:
    # By host name: a cookie jar keeps no cookie that an IP address set.
    policy = make_policy(upstream.url.replace("127.0.0.1", "localhost"))
    gw, runner = await run_gateway(policy, upstream)
    try:
        upstream.set_cookie = "affinity=acme-node; Path=/"
        assert (await gw.chat("acme", {"model": "smollm2", "messages": MSG})).status == 200
        upstream.set_cookie = ""
        assert (await gw.chat("globex", {"model": "smollm2", "messages": MSG})).status == 200
        assert upstream.received[-1].header_values("cookie") == []
    finally:
        await gw.session.close()
        await runner.cleanup()
