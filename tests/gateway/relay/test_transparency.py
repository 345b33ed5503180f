"""What a client sees through the gateway is what the server said: the answer's Content-Type as
sent (charset included), the backend's own model cards, an error in any shape turned into
OpenAI's with its status and message, and a plain answer that takes longer than the time to
first byte still answered (its own limit is `timeouts.total_s`, over its headers and its body,
each read of which is limited by `timeouts.idle_s` too)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest

from gateway.policy.load import parse_policy
from gateway.relay.error_shape import openai_shaped
from kvfence.verdict import VERDICT_HEADER
from tests.fakes.openai_upstream import MODEL_CARDS, FakeUpstream
from tests.kit.gateway import ENV, Gateway, deadlines, policy_text, run_gateway

MSG = [{"role": "user", "content": "L'Étoile"}]


async def _gateway(upstream: FakeUpstream, text: str) -> AsyncIterator[Gateway]:
    gw, runner = await run_gateway(parse_policy(text, "t.yaml", env=ENV), upstream)
    yield gw
    await gw.session.close()
    await runner.cleanup()


@pytest.mark.parametrize("stream", [False, True])
async def test_the_content_type_reaches_the_client_as_sent(
    gw: Gateway, upstream: FakeUpstream, stream: bool
) -> None:
    upstream.plain_type = "application/json; charset=utf-8"
    upstream.sse_type = "text/event-stream; charset=utf-8"
    resp = await gw.chat("acme", {"model": "smollm2", "messages": MSG, "stream": stream})
    assert resp.status == 200
    sent = upstream.sse_type if stream else upstream.plain_type
    assert resp.headers["content-type"] == sent
    await resp.read()


async def test_a_local_error_keeps_its_own_content_type(gw: Gateway) -> None:
    resp = await gw.chat("acme", {"model": "smollm2", "messages": MSG, "max_tokns": 3})
    assert (resp.status, resp.headers["content-type"]) == (400, "application/json")


async def test_models_carry_the_backends_own_cards(gw: Gateway) -> None:
    listed = await (await gw.session.get(gw.url + "/v1/models", headers=gw.auth("acme"))).json()
    assert listed["data"] == [MODEL_CARDS[0]]  # max_model_len, root, permission, owned_by
    got = await gw.session.get(gw.url + "/v1/models/smollm2", headers=gw.auth("acme"))
    assert await got.json() == MODEL_CARDS[0]
    # a model the backend serves but the policy does not offer stays unseen
    hidden = await gw.session.get(gw.url + "/v1/models/not-yours", headers=gw.auth("acme"))
    assert hidden.status == 404
    assert gw.upstream.received == []


async def test_a_model_no_backend_gives_a_card_for_gets_the_gateways_own(gw: Gateway) -> None:
    listed = await (await gw.session.get(gw.url + "/v1/models", headers=gw.auth("globex"))).json()
    other = next(m for m in listed["data"] if m["id"] == "other")
    assert other == {"id": "other", "object": "model", "created": 0, "owned_by": "kvfence"}


async def test_an_error_in_another_shape_is_answered_in_openais(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    upstream.mode = "detail"
    resp = await gw.session.post(
        gw.url + "/v1/embeddings", json={"model": "smollm2", "input": "x"}, headers=gw.auth("acme")
    )
    assert resp.status == 404
    assert resp.headers["content-type"] == "application/json"
    assert await resp.json() == {
        "error": {"message": "Not Found", "type": "invalid_request_error", "param": None,
                  "code": 404}
    }  # fmt: skip
    assert resp.headers[VERDICT_HEADER] == "unattested"  # an error generated nothing


@pytest.mark.parametrize(
    ("status", "raw", "message"),
    [
        (404, b'{"detail":"Not Found"}', "Not Found"),
        (422, b'{"detail":[{"loc":["body","x"],"msg":"bad"}]}',
         '[{"loc":["body","x"],"msg":"bad"}]'),
        (400, b'{"object":"error","message":"too long","type":"BadRequestError","code":400}',
         "too long"),
        (502, b"<html>bad gateway</html>", "<html>bad gateway</html>"),
        (503, b"", "Service Unavailable"),
    ],
)  # fmt: skip
def test_error_shapes(status: int, raw: bytes, message: str) -> None:
    shaped = openai_shaped(status, raw)
    assert shaped is not None
    error = orjson.loads(shaped)["error"]
    assert (error["message"], error["code"], error["param"]) == (message, status, None)
    assert error["type"] == ("server_error" if status >= 500 else "invalid_request_error")


def test_an_openai_error_passes_byte_for_byte() -> None:
    raw = b'{"error": {"message": "bad", "type": "BadRequestError", "param": "n", "code": 400}}'
    assert openai_shaped(400, raw) is None


@pytest.fixture
async def slow(upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    upstream.plain_delay_s = 1.5  # beyond first_byte_s
    text = policy_text(upstream.url, timeouts=deadlines(first_byte_s=1, total_s=5))
    async for gw in _gateway(upstream, text):
        yield gw


async def test_a_plain_answer_slower_than_first_byte_is_answered(slow: Gateway) -> None:
    resp = await slow.chat("acme", {"model": "smollm2", "messages": MSG})
    assert resp.status == 200
    assert (await resp.json())["choices"]


async def test_a_plain_answer_past_total_s_is_a_504(upstream: FakeUpstream) -> None:
    upstream.plain_delay_s = 3.0
    text = policy_text(upstream.url, timeouts=deadlines(total_s=0.5))
    async for gw in _gateway(upstream, text):
        resp = await gw.chat("acme", {"model": "smollm2", "messages": MSG})
        assert resp.status == 504
        error = (await resp.json())["error"]
        assert (error["code"], error["param"]) == ("upstream_timeout", None)


@pytest.mark.parametrize(
    ("pieces", "apart_s", "total_s", "status", "message"),
    [
        (4, 0.3, 5, 200, None),  # every piece within idle_s, the whole within total_s
        (8, 0.3, 1, 504, "backend did not finish its answer in time"),  # past total_s
        (2, 1.5, 5, 504, "backend stalled while answering"),  # a piece later than idle_s
    ],
    ids=["within", "past_total", "stalled"],
)
async def test_a_plain_body_is_limited_by_idle_s_per_read_and_total_s_in_all(
    upstream: FakeUpstream, pieces: int, apart_s: float, total_s: float, status: int,
    message: str | None,
) -> None:  # fmt: skip
    upstream.trickle, upstream.trickle_s = pieces, apart_s  # headers at once, then the body
    text = policy_text(upstream.url, timeouts=deadlines(idle_s=1, total_s=total_s))
    async for gw in _gateway(upstream, text):
        resp = await gw.chat("acme", {"model": "smollm2", "messages": MSG})
        assert resp.status == status
        body = await resp.json()
        if message is None:
            assert body["choices"][0]["message"]["content"]
        else:
            error = body["error"]
            assert (error["code"], error["message"]) == ("upstream_timeout", message)
