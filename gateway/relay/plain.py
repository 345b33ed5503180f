"""The upstream call of one attempt and its plain answer; a stream goes to `stream`. The relay
moves bytes: what they mean, and what the client may have of them, the request's exchange
decides (`gateway.audit.exchange`).

Invariant: no byte of a plain answer reaches the client before the exchange has settled it,
and an attempt that fails, or whose client leaves, is settled by the exchange before its error
(or the cancel) goes on.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web

from gateway.audit.events import SSE
from gateway.audit.exchange import Exchange
from gateway.audit.replies import Withheld
from gateway.errors import GatewayError, UpstreamTimeout, UpstreamUnavailable, error_response
from gateway.relay.client import Answer
from gateway.relay.context import context_of
from gateway.relay.error_shape import openai_shaped
from gateway.relay.failures import describe
from gateway.relay.headers import remember
from gateway.relay.reading import read_all
from gateway.relay.session import UPSTREAM
from gateway.relay.stream import relay_stream
from gateway.relay.watch import Watch
from gateway.state import BODY, ROUTE, RUNTIME, TIMING, UPSTREAM_BODY, UPSTREAM_HEADERS
from kvfence.attestation import ATTESTATION_HEADER


def _deadline(request: web.Request) -> tuple[str, float]:
    """A stream's headers come at its first token: `first_byte_s`. A plain answer's come only
    when it is done, so its one limit is `total_s`, over the headers and the body together."""
    timeouts = request[RUNTIME].policy.gateway.timeouts
    if request[BODY].get("stream") is True:
        return "first_byte_s", timeouts.first_byte_s
    return "total_s", timeouts.total_s


async def _open(request: web.Request, watch: Watch) -> Answer:
    route, runtime = request[ROUTE], request[RUNTIME]
    data = request[UPSTREAM_BODY]
    request[TIMING].upstream_sent = time.perf_counter()
    url = runtime.upstream_urls[route.backend.name, request.path]
    name, limit_s = _deadline(request)
    try:
        with watch.within(limit_s):
            return await request.app[UPSTREAM].post(
                url, data, request[UPSTREAM_HEADERS], runtime.policy.gateway.timeouts.connect_s
            )
    except TimeoutError as exc:
        cause = describe(exc)
        if not isinstance(exc, aiohttp.ClientError):  # our own deadline, not aiohttp's
            cause = f"no answer within timeouts.{name} ({limit_s:g} s)"
        message = f"backend {route.backend.name} did not answer in time"
        raise UpstreamTimeout(message, cause=cause) from None
    except aiohttp.ClientError as exc:
        message = f"backend {route.backend.name} is unavailable"
        raise UpstreamUnavailable(message, cause=describe(exc)) from None


async def _relay(
    request: web.Request,
    upstream: Answer,
    exchange: Exchange,
    attested: bool,
    watch: Watch,
    until: float,
) -> web.StreamResponse:
    exchange.began(upstream.status)
    if upstream.status == 200 and upstream.content_type == SSE:
        remember(request, upstream)  # the stream's headers are the stream relay's
        return await relay_stream(request, upstream, exchange, attested, watch)
    gateway = request[RUNTIME].policy.gateway
    body = await read_all(upstream, watch, gateway.timeouts, gateway.limits.max_answer_bytes, until)
    content_type = upstream.headers.get("content-type", "application/json")
    if not 200 <= upstream.status < 300 and not attested:
        # our backend's errors are judged as sent: its non-plain error is `missing`
        reshaped = openai_shaped(upstream.status, body)
        if reshaped is not None:
            body, content_type = reshaped, "application/json"
    attestations = upstream.headers.getall(ATTESTATION_HEADER, [])
    answer = await exchange.plain(body, attestations)
    request[TIMING].client_headers = time.perf_counter()
    if isinstance(answer, Withheld):
        return error_response(answer.error, answer.request_id, headers=answer.headers)
    headers = {"content-type": content_type, **answer.headers}
    return web.Response(body=answer.body, status=upstream.status, headers=headers)


async def forward(request: web.Request) -> web.StreamResponse:
    """One attempt: its exchange started, the scoped request upstream, its answer relayed to
    the client; one timer (`Watch`) limits every wait of it."""
    context = context_of(request)
    exchange = await Exchange.start(context)
    gateway = request[RUNTIME].policy.gateway
    watch = Watch(min(gateway.timeouts.idle_s, gateway.limits.write_timeout_s))
    until = asyncio.get_running_loop().time() + gateway.timeouts.total_s
    try:
        upstream = await _open(request, watch)
        request[TIMING].upstream_headers = time.perf_counter()
        try:
            return await _relay(request, upstream, exchange, context.audit.attested, watch, until)
        finally:
            upstream.release()
    except GatewayError as exc:
        await exchange.fail(exc)  # the record says how it failed; then the client hears it
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        await exchange.left("client_closed")  # the client went away: its request is recorded
        raise
    finally:
        watch.close()
