"""The terminal step: send the scoped request upstream and relay a plain answer; streams go to
`stream_relay`. Both move bytes and settle once (`gateway.audit.settle`).

Invariant: no byte of an answer reaches the client before its verdict is known, and every
request that reached this step is settled once, failures included.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
from aiohttp import web

from gateway.audit.exchange import Exchange
from gateway.audit.judge import UNATTESTED, is_plain_error, judge
from gateway.audit.settle import VERDICT_HEADER, settle
from gateway.audit.usage import parse_usage
from gateway.errors import (
    AnswerTooLarge,
    GatewayError,
    HandleRefused,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from gateway.relay.failures import describe
from gateway.relay.reading import read_chunk
from gateway.relay.stream import SSE, relay_stream
from gateway.state import (
    REQUEST_ID,
    ROUTE,
    RUNTIME,
    SESSION,
    TIMING,
    UPSTREAM_BODY,
    UPSTREAM_HEADERS,
)
from kvfence.attestation import ATTESTATION_HEADER

log = logging.getLogger("kvfence.gateway.proxy")


async def _open(request: web.Request) -> aiohttp.ClientResponse:
    route, runtime = request[ROUTE], request[RUNTIME]
    data = request[UPSTREAM_BODY]
    request[TIMING].upstream_sent = time.perf_counter()
    url = runtime.upstream_urls[route.backend.name, request.path]
    first_byte_s = runtime.policy.gateway.timeouts.first_byte_s
    try:
        async with asyncio.timeout(first_byte_s):
            return await request.app[SESSION].post(
                url, data=data, headers=request[UPSTREAM_HEADERS], timeout=runtime.upstream_timeout
            )
    except TimeoutError as exc:
        cause = describe(exc)
        if not isinstance(exc, aiohttp.ClientError):  # our own deadline, not aiohttp's
            cause = f"no answer within timeouts.first_byte_s ({first_byte_s:g} s)"
        message = f"backend {route.backend.name} did not answer in time"
        raise UpstreamTimeout(message, cause=cause) from None
    except aiohttp.ClientError as exc:
        message = f"backend {route.backend.name} is unavailable"
        raise UpstreamUnavailable(message, cause=describe(exc)) from None


async def _read_all(upstream: aiohttp.ClientResponse, idle_s: float, cap: int) -> bytes:
    """The whole plain answer (it is judged before its first byte is sent), at most `cap`."""
    parts: list[bytes] = []
    size = 0
    try:
        while chunk := await read_chunk(upstream, idle_s):
            size += len(chunk)
            if size > cap:
                raise AnswerTooLarge(f"the backend's answer is over {cap} bytes")
            parts.append(chunk)
    except TimeoutError:
        cause = f"stalled: no data within timeouts.idle_s ({idle_s:g} s)"
        raise UpstreamTimeout("backend stalled while answering", cause=cause) from None
    except aiohttp.ClientError as exc:
        cause = describe(exc)
        raise UpstreamUnavailable("backend failed while answering", cause=cause) from None
    return b"".join(parts)


async def _relay_body(
    request: web.Request, upstream: aiohttp.ClientResponse, exchange: Exchange
) -> web.Response:
    ctx, answer = exchange.ctx, exchange.answer
    gateway = request[RUNTIME].policy.gateway
    body = await _read_all(upstream, gateway.timeouts.idle_s, gateway.limits.max_answer_bytes)
    answer.attestations = list(upstream.headers.getall(ATTESTATION_HEADER, ()))
    parsed, usage = parse_usage(body)
    answer.read_usage(usage)
    if not 200 <= upstream.status < 300:
        answer.plain_error = is_plain_error(body)
    exchange.scan.body(body, parsed)
    exchange.finish()
    judgement = judge(ctx, answer)
    withheld = await settle(request, ctx, answer, judgement)
    request[TIMING].client_headers = time.perf_counter()
    if withheld is not None:
        return withheld
    return web.Response(
        body=body,
        status=upstream.status,
        headers={
            "content-type": upstream.content_type,
            "x-request-id": request[REQUEST_ID],
            VERDICT_HEADER: judgement.verdict.value,
        },
    )


async def _relay(request: web.Request, exchange: Exchange) -> web.StreamResponse:
    upstream = await _open(request)
    request[TIMING].upstream_headers = time.perf_counter()
    ctx = exchange.ctx
    exchange.answer.status = upstream.status
    try:
        if ctx.attested and upstream.status in (401, 403):
            log.error("backend refused the handle", extra={"rid": ctx.request_id})
            raise HandleRefused(f"backend {ctx.backend.name} refused the gateway's handle")
        if upstream.status == 200 and upstream.content_type == SSE:
            return await relay_stream(request, upstream, exchange)
        return await _relay_body(request, upstream, exchange)
    finally:
        upstream.release()


async def forward(request: web.Request) -> web.StreamResponse:
    exchange = await Exchange.start(request)
    try:
        return await _relay(request, exchange)
    except GatewayError as exc:
        if not exchange.answer.settled:
            # Failed before an answer was settled: the record says how, then the client hears it.
            ctx, answer = exchange.ctx, exchange.answer
            await settle(request, ctx, answer, UNATTESTED, status=exc.status, reason=exc.code)
        raise
