"""The official `openai` client works unchanged through the gateway."""

import openai

from tests.fakes.openai_upstream import CACHED_TOKENS
from tests.kit.gateway import KEYS, Gateway

MSG = [{"role": "user", "content": "hi"}]


def _client(gw: Gateway, tenant: str = "acme") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=KEYS[tenant], max_retries=0)


async def test_non_streaming(gw: Gateway) -> None:
    async with _client(gw) as client:
        out = await client.chat.completions.create(model="smollm2", messages=MSG)  # type: ignore[arg-type]
    assert out.choices[0].message.content == "Hello there!"
    assert out.usage is not None and out.usage.prompt_tokens_details is not None
    assert out.usage.prompt_tokens_details.cached_tokens == CACHED_TOKENS
    assert gw.upstream.received[-1].json["cache_salt"].startswith("ns1.")


async def test_streaming(gw: Gateway) -> None:
    async with _client(gw) as client:
        stream = await client.chat.completions.create(
            model="smollm2",
            messages=MSG,
            stream=True,  # type: ignore[arg-type]
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "Hello there!"


async def test_models_and_errors(gw: Gateway) -> None:
    async with _client(gw) as client:
        models = await client.models.list()
        assert [m.id for m in models.data] == ["smollm2"]
        assert (await client.models.retrieve("smollm2")).id == "smollm2"
        for call in (
            client.chat.completions.create(model="other", messages=MSG),  # type: ignore[arg-type]
            client.models.retrieve("other"),
        ):
            try:
                await call
            except openai.NotFoundError as exc:
                assert exc.status_code == 404 and exc.code == "model_not_found"
            else:
                raise AssertionError("expected 404")


async def test_stream_cut_mid_way_raises(gw: Gateway) -> None:
    gw.upstream.mode = "die_mid"
    async with _client(gw) as client:
        stream = await client.chat.completions.create(
            model="smollm2",
            messages=MSG,
            stream=True,  # type: ignore[arg-type]
        )
        got = []
        try:
            async for chunk in stream:
                got.append(chunk)
        except openai.APIError as exc:
            assert "mid-stream" in str(exc)
        else:
            raise AssertionError("a cut stream must not end normally")
    assert len(got) == 2
