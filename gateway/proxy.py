"""The terminal step: send the scoped request upstream and relay the answer as it arrives.

Invariant: a stream that fails after it started ends with an SSE error event and a closed
connection, never with `[DONE]`, so a truncated answer cannot look complete.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

import aiohttp
import orjson
from aiohttp import web

from gateway.errors import UpstreamTimeout, UpstreamUnavailable, error_body
from gateway.policy import Timeouts
from gateway.sse import UsageScanner, cached_tokens
from gateway.state import (
    BODY,
    DROP_USAGE,
    METRICS,
    REQUEST_ID,
    ROUTE,
    RUNTIME,
    TENANT,
    TIMING,
    UPSTREAM_HEADERS,
)

SESSION = web.AppKey("kvfence_upstream_session", aiohttp.ClientSession)
log = logging.getLogger("kvfence.gateway.proxy")
_SSE: Final = "text/event-stream"


async def _open(request: web.Request, timeouts: Timeouts) -> aiohttp.ClientResponse:
    route = request[ROUTE]
    data = orjson.dumps(request[BODY])
    timeout = aiohttp.ClientTimeout(sock_connect=timeouts.connect_s)
    request[TIMING].upstream_sent = time.perf_counter()
    try:
        async with asyncio.timeout(timeouts.first_byte_s):
            return await request.app[SESSION].post(
                route.backend.url + request.path,
                data=data,
                headers=request[UPSTREAM_HEADERS],
                timeout=timeout,
            )
    except TimeoutError:
        raise UpstreamTimeout(f"backend {route.backend.name} did not answer in time") from None
    except aiohttp.ClientError:
        raise UpstreamUnavailable(f"backend {route.backend.name} is unavailable") from None


async def _read(upstream: aiohttp.ClientResponse, idle_s: float) -> bytes:
    async with asyncio.timeout(idle_s):
        return await upstream.content.readany()


def _record_cached(request: web.Request, tokens: int | None) -> None:
    if tokens:
        request.app[METRICS].cached_tokens.labels(request[TENANT].id).inc(tokens)


async def _relay_body(request: web.Request, upstream: aiohttp.ClientResponse) -> web.Response:
    idle_s = request[RUNTIME].policy.gateway.timeouts.idle_s
    parts: list[bytes] = []
    try:
        while chunk := await _read(upstream, idle_s):
            parts.append(chunk)
    except TimeoutError:
        raise UpstreamTimeout("backend stalled while answering") from None
    except aiohttp.ClientError:
        raise UpstreamUnavailable("backend failed while answering") from None
    body = b"".join(parts)
    if upstream.status == 200 and b'"cached_tokens"' in body:
        try:
            _record_cached(request, cached_tokens(orjson.loads(body).get("usage")))
        except (orjson.JSONDecodeError, AttributeError):
            log.debug("upstream body is not a JSON object", extra={"rid": request[REQUEST_ID]})
    request[TIMING].client_headers = time.perf_counter()
    return web.Response(
        body=body,
        status=upstream.status,
        headers={"content-type": upstream.content_type, "x-request-id": request[REQUEST_ID]},
    )


async def _relay_stream(
    request: web.Request, upstream: aiohttp.ClientResponse
) -> web.StreamResponse:
    resp = web.StreamResponse(
        status=upstream.status,
        headers={
            "content-type": _SSE,
            "cache-control": "no-cache",
            "x-request-id": request[REQUEST_ID],
        },
    )
    await resp.prepare(request)
    request[TIMING].client_headers = time.perf_counter()
    scanner = UsageScanner(drop_usage=request[DROP_USAGE])
    idle_s = request[RUNTIME].policy.gateway.timeouts.idle_s
    while True:
        try:
            chunk = await _read(upstream, idle_s)
        except (TimeoutError, aiohttp.ClientError) as exc:
            await _fail_stream(request, resp, exc)
            return resp
        if not chunk:
            break
        out = scanner.feed(chunk)
        if not scanner.drop_usage:
            await resp.write(chunk)
        elif out:  # an empty write could end the chunked body early
            await resp.write(out)
    tail = scanner.tail()
    if tail and scanner.drop_usage:
        await resp.write(tail)
    _record_cached(request, scanner.cached_tokens)
    await resp.write_eof()
    return resp


async def _fail_stream(request: web.Request, resp: web.StreamResponse, exc: BaseException) -> None:
    error = (
        UpstreamTimeout("backend stalled mid-stream")
        if isinstance(exc, TimeoutError)
        else UpstreamUnavailable("backend failed mid-stream")
    )
    log.warning("stream cut", extra={"rid": request[REQUEST_ID], "error": type(exc).__name__})
    resp.force_close()
    await resp.write(b"\n\nevent: error\ndata: " + error_body(error) + b"\n\n")
    await resp.write_eof()


async def forward(request: web.Request) -> web.StreamResponse:
    upstream = await _open(request, request[RUNTIME].policy.gateway.timeouts)
    request[TIMING].upstream_headers = time.perf_counter()
    try:
        if upstream.status == 200 and upstream.content_type == _SSE:
            return await _relay_stream(request, upstream)
        return await _relay_body(request, upstream)
    finally:
        upstream.release()
