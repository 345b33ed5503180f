"""Relaying a streamed answer: the first event (where our backend puts its attestation) goes to
the exchange before anything is sent; then every chunk passes through the exchange, which says
what the client may have of it now, until the end, when it gives back what it held (`[DONE]`).

Invariant: the client gets only bytes the exchange handed back, in order; a stream that cannot
go on ends with an `error` event, never `[DONE]`, once the exchange has settled it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import aiohttp
from aiohttp import web

from gateway.audit.events import SSE
from gateway.audit.exchange import Exchange
from gateway.audit.replies import Withheld
from gateway.errors import (
    GatewayError,
    UpstreamTimeout,
    UpstreamUnavailable,
    error_event,
    error_response,
)
from gateway.relay.client import Answer
from gateway.relay.failures import describe
from gateway.relay.reading import first_event_of, read_chunk
from gateway.relay.watch import Watch
from gateway.state import RUNTIME, TIMING


class ClientStalled(Exception):
    """The client read nothing for `limits.write_timeout_s` while its stream was waiting."""


async def _send(
    resp: web.StreamResponse, data: bytes, watch: Watch, deadline_s: float, last: bool = False
) -> None:
    """`data` to the client within the deadline; `last`: with the body's end, in one write."""
    if not data and not last:  # an empty write could end the chunked body early
        return
    try:
        with watch.within(deadline_s):
            await (resp.write_eof(data) if last else resp.write(data))
    except TimeoutError:
        raise ClientStalled from None


async def relay_stream(
    request: web.Request,
    upstream: Answer,
    exchange: Exchange,
    attested: bool,
    watch: Watch,
) -> web.StreamResponse:
    """`attested`: the stream's first event carries its attestation (the exchange reads it
    before anything is sent); `watch`: the attempt's one timer, for every read and write."""
    gateway = request[RUNTIME].policy.gateway
    idle_s, write_s = gateway.timeouts.idle_s, gateway.limits.write_timeout_s
    event, chunk = await first_event_of(upstream, watch, idle_s) if attested else (None, b"")
    head = await exchange.head(event)
    if isinstance(head, Withheld):
        return error_response(head.error, head.request_id, headers=head.headers)
    headers = {"content-type": SSE, "cache-control": "no-cache", **head.headers}
    resp = web.StreamResponse(status=upstream.status, headers=headers)
    await resp.prepare(request)
    request[TIMING].client_headers = time.perf_counter()
    try:
        if head.first:
            await resp.write(head.first)
        while True:
            await _send(resp, exchange.events(chunk), watch, write_s)
            try:
                chunk = await read_chunk(upstream, watch, idle_s)
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise _cut_error(exc) from None
            if not chunk:
                break
        await _send(resp, await exchange.end(), watch, write_s, last=True)
    except GatewayError as error:  # cut short, withheld, its record or receipt lost: no `[DONE]`
        await _end_with_error(resp, await exchange.fail(error))
        return resp
    except ClientStalled:
        await exchange.left("client_stalled")
        if request.transport is not None:
            request.transport.abort()  # its buffers are full: nothing more can be said
        return resp
    except asyncio.CancelledError:
        await exchange.left("client_closed")  # the client went away: the answer gets its record
        raise
    except ConnectionResetError:  # a write met the closed connection before the cancellation
        await exchange.left("client_closed")
        return resp  # a normal exit, not a server error to log
    return resp


def _cut_error(exc: BaseException) -> GatewayError:
    if isinstance(exc, TimeoutError):
        return UpstreamTimeout("backend stalled mid-stream", cause="stalled: no event in idle_s")
    return UpstreamUnavailable("backend failed mid-stream", cause=describe(exc))


async def _end_with_error(resp: web.StreamResponse, error: GatewayError) -> None:
    """An `error` event, never `[DONE]`, then a properly ended body: the connection stays usable
    (keep-alive), and no client takes the truncated answer for a complete one."""
    with contextlib.suppress(ConnectionResetError):
        async with asyncio.timeout(5):
            await resp.write_eof(error_event(error))
