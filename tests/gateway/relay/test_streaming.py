"""Streaming relay: byte-for-byte, usage handling, upstream failures, client disconnects."""

import asyncio

import aiohttp
import pytest

from tests.fakes.openai_upstream import CACHED_TOKENS, sse_events
from tests.kit.gateway import Gateway

MSG = [{"role": "user", "content": "hi"}]
STREAM = {"model": "smollm2", "messages": MSG, "stream": True}


@pytest.mark.parametrize("split", [False, True])
async def test_relay_is_byte_for_byte_when_client_asks_usage(gw: Gateway, split: bool) -> None:
    gw.upstream.split = split
    body = {**STREAM, "stream_options": {"include_usage": True}}
    resp = await gw.chat("acme", body)
    assert resp.status == 200 and resp.content_type == "text/event-stream"
    assert await resp.read() == b"".join(sse_events(include_usage=True))


@pytest.mark.parametrize("split", [False, True])
async def test_usage_chunk_added_for_audit_and_hidden(gw: Gateway, split: bool) -> None:
    gw.upstream.split = split
    resp = await gw.chat("acme", STREAM)
    got = await resp.read()
    assert gw.upstream.received[-1].json["stream_options"] == {"include_usage": True}
    # No usage event, and no `"usage":null` in a chunk: the stream the client would get direct.
    assert got == b"".join(sse_events(include_usage=False))
    assert got.endswith(b"data: [DONE]\n\n")
    metrics = await gw.metrics()
    labels = '{model="smollm2",tenant="acme"}'
    assert f"kvfence_gateway_cached_tokens_total{labels} {CACHED_TOKENS}.0" in metrics
    assert f"kvfence_gateway_prompt_tokens_total{labels} 12.0" in metrics
    assert f"kvfence_gateway_completion_tokens_total{labels} 3.0" in metrics
    assert f"kvfence_gateway_time_to_first_token_seconds_count{labels} 1.0" in metrics
    assert f"kvfence_gateway_in_flight{labels} 0.0" in metrics


async def test_per_chunk_usage_is_not_asked_for_a_client_that_did_not_ask_for_usage(
    gw: Gateway,
) -> None:
    body = {**STREAM, "stream_options": {"continuous_usage_stats": True}}
    got = await (await gw.chat("acme", body)).read()
    assert gw.upstream.received[-1].json["stream_options"] == {"include_usage": True}
    assert got == b"".join(sse_events(include_usage=False))


async def test_upstream_dead_before_response_is_502(gw: Gateway) -> None:
    gw.upstream.mode = "die_before"
    resp = await gw.chat("acme", STREAM)
    assert resp.status == 502
    assert (await resp.json())["error"]["code"] == "upstream_unavailable"


async def test_upstream_unreachable_is_502(gw: Gateway) -> None:
    await gw.upstream.close()
    resp = await gw.chat("acme", {"model": "smollm2", "messages": MSG})
    assert resp.status == 502


async def test_upstream_stalled_before_response_is_504(quick_gw: Gateway) -> None:
    quick_gw.upstream.mode = "stall_before"
    resp = await quick_gw.chat("acme", {"model": "smollm2", "messages": MSG})
    assert resp.status == 504
    assert (await resp.json())["error"]["type"] == "server_error"


async def test_upstream_death_mid_stream_ends_with_error_event(gw: Gateway) -> None:
    gw.upstream.mode = "die_mid"
    resp = await gw.chat("acme", STREAM)
    assert resp.status == 200
    got = b""
    try:
        async for chunk in resp.content.iter_any():
            got += chunk
    except aiohttp.ClientPayloadError:
        pass
    events = sse_events(include_usage=False)  # as the client gets them: it asked no usage
    assert got.startswith(events[0] + events[1])
    assert b"event: error\ndata: " in got and b"upstream_unavailable" in got
    assert b"[DONE]" not in got


async def test_client_disconnect_cancels_upstream(gw: Gateway) -> None:
    gw.upstream.mode = "hold"
    resp = await gw.chat("acme", STREAM)
    first = await resp.content.readuntil(b"\n\n")
    assert first.startswith(b"data: ")
    resp.close()  # the client goes away mid-stream
    await asyncio.wait_for(gw.upstream.cancelled.wait(), timeout=10)
    assert gw.upstream.cancelled.is_set()
