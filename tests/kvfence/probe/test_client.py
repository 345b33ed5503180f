"""One timed request against real aiohttp apps on port 0: what it sends, what it reads, and how
it treats 429 with Retry-After, transient failures, refusals, and servers that are not OpenAI
streams; no message ever carries a key."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kvfence.probe.client import Api, Endpoint, Identity, Observation, send
from kvfence.probe.errors import (
    AuthRefused,
    GaveUp,
    ModelNotServed,
    ProtocolError,
    RequestRejected,
    server_message,
)
from kvfence.probe.pacing import Pacer, RetryPolicy, retry_after_s

KEY = "sk-live-0123456789abcdef"
A = Identity("A", key=KEY, headers=(("X-End-User", "alice"),), body=(("cache_salt", "s-a"),))
Answer = Callable[[web.Request], Awaitable[web.StreamResponse]]
MakeServer = Callable[[web.Application], Awaitable[TestServer]]


async def stream(request: web.Request, usage: dict[str, Any] | None = None) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b'data: {"choices": []}\n\n')  # an Azure-style preamble: no choice yet
    await resp.write(b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n')
    if usage is not None:
        await resp.write(b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    return resp


def usage_stream(cached: int) -> Answer:
    async def answer(request: web.Request) -> web.StreamResponse:
        usage = {"prompt_tokens": 300, "prompt_tokens_details": {"cached_tokens": cached}}
        return await stream(request, usage)

    return answer


def status(code: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Answer:
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.json_response(body, status=code, headers=headers)

    return answer


class Scripted:
    """Answers requests in turn from a script (the last answer repeats); records each body."""

    def __init__(self, *answers: Answer) -> None:
        self.answers, self.bodies, self.headers = list(answers), [], []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        self.headers.append(dict(request.headers))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return await answer(request)


@pytest.fixture
async def serve(
    aiohttp_server: MakeServer,
) -> AsyncIterator[Callable[..., Awaitable[tuple[Scripted, Endpoint]]]]:
    async def start(
        *answers: Answer, api: Api = Api.CHAT, timeout_s: float = 10
    ) -> tuple[Scripted, Endpoint]:
        script = Scripted(*answers)
        app = web.Application()
        app.router.add_post("/v1/{tail:.*}", script.handle)
        server = await aiohttp_server(app)
        return script, Endpoint(str(server.make_url("")), "smollm2", api, timeout_s)

    yield start


class Waits:
    def __init__(self) -> None:
        self.seconds: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)


async def measure(endpoint: Endpoint, retry: RetryPolicy | None = None) -> Observation:
    async with aiohttp.ClientSession() as session:
        return await send(session, endpoint, A, "5eed a b c", retry or RetryPolicy(sleep=Waits()))


async def test_sends_one_token_streaming_with_usage_and_the_identity(serve: Any) -> None:
    script, endpoint = await serve(usage_stream(256))
    obs = await measure(endpoint)
    body = script.bodies[0]
    assert body["max_tokens"] == 1 and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "5eed a b c"}]
    assert body["cache_salt"] == "s-a" and body["model"] == "smollm2"
    assert script.headers[0]["Authorization"] == f"Bearer {KEY}"
    assert script.headers[0]["X-End-User"] == "alice"
    assert obs.cached_tokens == 256 and obs.prompt_tokens == 300 and obs.ttft_s > 0


async def test_completions_api_sends_a_prompt(serve: Any) -> None:
    script, endpoint = await serve(usage_stream(0), api=Api.COMPLETIONS)
    await measure(endpoint)
    assert script.bodies[0]["prompt"] == "5eed a b c" and "messages" not in script.bodies[0]


@pytest.mark.parametrize(
    ("usage", "cached"),
    [
        (None, None),
        ({"prompt_tokens": 9, "prompt_tokens_details": None}, None),
        ({"prompt_tokens": 9, "prompt_cache_hit_tokens": 128}, 128),  # DeepSeek's field
    ],
)
async def test_reads_whatever_counter_the_server_has(serve: Any, usage: Any, cached: Any) -> None:
    async def answer(request: web.Request) -> web.StreamResponse:
        return await stream(request, usage)

    _, endpoint = await serve(answer)
    assert (await measure(endpoint)).cached_tokens == cached


async def test_429_waits_as_long_as_retry_after_says(serve: Any) -> None:
    _, endpoint = await serve(
        status(429, {"error": {"message": "slow down"}}, {"Retry-After": "7"}), usage_stream(0)
    )
    waits = Waits()
    obs = await measure(endpoint, RetryPolicy(sleep=waits))
    assert waits.seconds == [7.0] and obs.attempts == 2


async def test_transient_errors_back_off_then_give_up(serve: Any) -> None:
    _, endpoint = await serve(status(503, {"error": {"message": "overloaded"}}))
    waits = Waits()
    with pytest.raises(GaveUp, match=r"503 overloaded .*3 attempts"):
        await measure(endpoint, RetryPolicy(attempts=3, sleep=waits))
    assert len(waits.seconds) == 2 and waits.seconds[0] < waits.seconds[1] * 2


async def test_a_retry_after_beyond_the_limit_gives_up_at_once(serve: Any) -> None:
    _, endpoint = await serve(status(429, {}, {"Retry-After": "3600"}))
    with pytest.raises(GaveUp, match="wait 3600 s"):
        await measure(endpoint)


async def test_refusal_names_the_credential_never_its_key(serve: Any) -> None:
    echo = {"error": {"message": f"Incorrect API key provided: {KEY}"}}
    _, endpoint = await serve(status(401, echo))
    with pytest.raises(AuthRefused) as caught:
        await measure(endpoint)
    assert "credential A was refused (401)" in str(caught.value)
    assert KEY not in str(caught.value) and "<redacted>" in str(caught.value)


async def test_model_not_served_is_said_plainly(serve: Any) -> None:
    _, endpoint = await serve(
        status(404, {"error": {"message": "The model `smollm2` does not exist."}})
    )
    with pytest.raises(ModelNotServed, match="does not serve model 'smollm2'"):
        await measure(endpoint)


async def test_other_refusals_quote_the_server(serve: Any) -> None:
    _, endpoint = await serve(status(400, {"error": {"message": "cache_salt must be non-empty"}}))
    with pytest.raises(RequestRejected, match=r"400.*cache_salt must be non-empty"):
        await measure(endpoint)


async def test_an_answer_that_does_not_stream_is_a_protocol_error(serve: Any) -> None:
    _, endpoint = await serve(status(200, {"choices": [{"message": {"content": "hi"}}]}))
    with pytest.raises(ProtocolError, match="without streaming"):
        await measure(endpoint)


async def test_a_stalled_server_times_out_within_the_retries(serve: Any) -> None:
    release = asyncio.Event()

    async def stall(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.Response()

    script, endpoint = await serve(stall, timeout_s=0.2)
    try:
        with pytest.raises(GaveUp, match=r"no complete answer within 0\.2 s"):
            await measure(endpoint, RetryPolicy(attempts=2, sleep=Waits()))
    finally:
        release.set()
    assert len(script.bodies) == 2


async def test_connection_refused_gives_up(unused_tcp_port: int) -> None:
    endpoint = Endpoint(f"http://127.0.0.1:{unused_tcp_port}", "m")
    with pytest.raises(GaveUp, match=f"cannot connect to 127.0.0.1:{unused_tcp_port}"):
        await measure(endpoint, RetryPolicy(attempts=2, sleep=Waits()))


async def test_an_oversized_stream_line_is_a_protocol_error(serve: Any) -> None:
    async def flood(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: " + b"x" * 1_000_000 + b"\n\n")
        return resp

    _, endpoint = await serve(flood)
    with pytest.raises(ProtocolError, match="malformed or oversized"):
        await measure(endpoint)


def test_identity_repr_and_description_hold_no_secret() -> None:
    assert KEY not in repr(A) and "alice" not in repr(A) and "s-a" not in repr(A)
    assert A.describe() == {
        "name": "A",
        "key": True,
        "headers": ["x-end-user"],
        "body_fields": ["cache_salt"],
    }


@pytest.mark.parametrize(
    ("base", "url"),
    [
        ("http://h:8000", "http://h:8000/v1/chat/completions"),
        ("http://h:8000/v1/", "http://h:8000/v1/chat/completions"),
        ("https://h/api/v2", "https://h/api/v2/chat/completions"),
    ],
)
def test_endpoint_url_accepts_a_base_with_or_without_version(base: str, url: str) -> None:
    assert Endpoint(base, "m").url == url


def test_safe_url_drops_user_info_and_query() -> None:
    endpoint = Endpoint("https://user:pw@h.example:8443/v1?key=abc", "m")
    assert endpoint.safe_url() == "https://h.example:8443/v1"


def test_retry_after_reads_seconds_and_dates() -> None:
    assert retry_after_s("12") == 12.0
    assert retry_after_s("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0
    assert retry_after_s("soon") is None and retry_after_s(None) is None


async def test_pacer_spaces_request_starts() -> None:
    now = [100.0]
    waits = Waits()
    pacer = Pacer(rate=4, sleep=waits, clock=lambda: now[0])
    await pacer.wait()
    await pacer.wait()
    now[0] += 0.1
    await pacer.wait()
    assert waits.seconds == [0.25, pytest.approx(0.4)]


def test_redaction_leaves_values_too_short_to_be_keys() -> None:
    raw = b'{"error": {"message": "The model `x` does not exist"}}'
    assert server_message(raw, ["x"]) == "The model `x` does not exist"
    assert server_message(raw, ["does not"]) == "The model `x` <redacted> exist"
