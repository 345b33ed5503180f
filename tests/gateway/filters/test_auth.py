"""Authentication, model policy, local routes and error shapes."""

import pytest

from kvfence.keys.apikey import mint_key
from tests.kit.gateway import KEYS, Gateway

MSG = [{"role": "user", "content": "hi"}]


async def _error(resp: object) -> dict[str, str]:
    body = await resp.json()  # type: ignore[attr-defined]
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Bearer " + mint_key()},
        {"authorization": "Basic abc"},
        {"x-api-key": mint_key()},
        {"authorization": "Bearer kvf_mistyped"},
    ],
)
async def test_missing_or_unknown_key_is_401(gw: Gateway, headers: dict[str, str]) -> None:
    resp = await gw.session.post(
        gw.url + "/v1/chat/completions", json={"model": "smollm2", "messages": MSG}, headers=headers
    )
    assert resp.status == 401
    assert (await _error(resp))["type"] == "authentication_error"
    assert gw.upstream.received == []


async def test_x_api_key_works(gw: Gateway) -> None:
    resp = await gw.session.post(
        gw.url + "/v1/chat/completions",
        json={"model": "smollm2", "messages": MSG},
        headers={"x-api-key": KEYS["acme"]},
    )
    assert resp.status == 200


async def test_two_different_keys_are_refused(gw: Gateway) -> None:
    resp = await gw.session.post(
        gw.url + "/v1/chat/completions",
        json={"model": "smollm2", "messages": MSG},
        headers={"authorization": f"Bearer {KEYS['acme']}", "x-api-key": KEYS["globex"]},
    )
    assert resp.status == 401


async def test_unknown_and_forbidden_models_are_the_same_404(gw: Gateway) -> None:
    """As OpenAI answers both: `other` exists (globex's), `no-such-model` does not; acme cannot
    tell them apart, on the proxied paths or on GET /v1/models/{id}."""
    answers = []
    for model in ("other", "no-such-model"):
        resp = await gw.chat("acme", {"model": model, "messages": MSG})
        got = await gw.session.get(f"{gw.url}/v1/models/{model}", headers=gw.auth("acme"))
        for r in (resp, got):
            assert r.status == 404
            error = await _error(r)
            assert error["code"] == "model_not_found"
            answers.append({**error, "message": error["message"].replace(model, "M")})
    assert all(a == answers[0] for a in answers), answers
    assert answers[0]["message"] == "The model `M` does not exist or you do not have access to it."
    assert gw.upstream.received == []


async def test_a_tenant_retrieves_its_own_models(gw: Gateway) -> None:
    resp = await gw.session.get(gw.url + "/v1/models/other", headers=gw.auth("globex"))
    assert resp.status == 200
    assert (await resp.json())["id"] == "other"
    assert (await gw.session.get(gw.url + "/v1/models/other")).status == 401


async def test_bad_bodies_are_400(gw: Gateway) -> None:
    for data in (b"not json", b"[1, 2]", b'{"messages": []}'):
        resp = await gw.session.post(
            gw.url + "/v1/chat/completions", data=data, headers=gw.auth("acme")
        )
        assert resp.status == 400
        assert (await _error(resp))["type"] == "invalid_request_error"


async def test_models_lists_only_the_tenants_models(gw: Gateway) -> None:
    acme = await (await gw.session.get(gw.url + "/v1/models", headers=gw.auth("acme"))).json()
    globex = await (await gw.session.get(gw.url + "/v1/models", headers=gw.auth("globex"))).json()
    assert [m["id"] for m in acme["data"]] == ["smollm2"]
    assert [m["id"] for m in globex["data"]] == ["other", "smollm2"]
    resp = await gw.session.get(gw.url + "/v1/models")
    assert resp.status == 401


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/reset_prefix_cache"),
        ("GET", "/v1/chat/completions"),
        ("POST", "/v1/audio/transcriptions"),
        ("GET", "/v1/../metrics/x"),
        ("POST", "/flush_cache"),
    ],
)
async def test_other_paths_are_404_and_never_proxied(gw: Gateway, method: str, path: str) -> None:
    resp = await gw.session.request(method, gw.url + path, headers=gw.auth("acme"))
    assert resp.status == 404
    assert (await _error(resp))["code"] == "not_found"
    assert gw.upstream.received == []


async def test_the_clients_request_id_comes_back_and_never_goes_upstream(gw: Gateway) -> None:
    resp = await gw.chat("acme", {"model": "smollm2", "messages": MSG}, **{"x-request-id": "abc-1"})
    assert resp.headers["x-request-id"] == "abc-1"
    [sent] = gw.upstream.received[-1].header_values("x-request-id")
    assert "abc-1" not in sent and len(sent) == 32  # the gateway's own
    resp = await gw.chat("acme", {"model": "smollm2", "messages": MSG}, **{"x-request-id": "abc-1"})
    assert gw.upstream.received[-1].header_values("x-request-id") != [sent]  # fresh each time
    resp = await gw.chat("acme", {"model": "smollm2", "messages": MSG})
    generated = resp.headers["x-request-id"]
    assert len(generated) == 32 and gw.upstream.received[-1].header_values("x-request-id") != [
        generated
    ]


async def test_health_and_metrics(gw: Gateway) -> None:
    assert (await gw.session.get(gw.url + "/healthz")).status == 200
    assert (await gw.session.get(gw.url + "/readyz")).status == 200
    # Metrics list tenant ids: they live on the admin listener, never on the tenant port.
    assert (await gw.session.get(gw.url + "/metrics")).status == 404
    await gw.chat("acme", {"model": "smollm2", "messages": MSG, "cache_salt": "x"})
    text = await gw.metrics()
    assert (
        'kvfence_gateway_requests_total{backend="fake-vllm",model="smollm2",status="200",'
        'tenant="acme"} 1.0' in text
    )
    assert 'kvfence_gateway_namespaces_injected_total{backend="fake-vllm"} 1.0' in text
    assert (
        'kvfence_gateway_client_inputs_total{action="strip",input="cache_salt",tenant="acme"} 1.0'
        in text
    )
    assert "kvfence_gateway_added_seconds_count 1.0" in text
