"""Relaying a streamed answer: the attestation event is judged and rewritten before anything
is sent, events pass on as they complete, and `[DONE]` waits for the answer to be settled.

Invariant: the client never sees the attestation, never sees a token of a withheld stream, and
never sees `[DONE]` unless the stream completed and its audit record was written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Final

import aiohttp
from aiohttp import web

from gateway.adapters.base import RESPONSES
from gateway.audit.exchange import Exchange
from gateway.audit.judge import Judgement, judge
from gateway.audit.settle import VERDICT_HEADER, settle
from gateway.audit.usage import UsageScanner, split_attestation_event
from gateway.errors import (
    AttestationRefused,
    AuditWriteFailed,
    GatewayError,
    UpstreamTimeout,
    UpstreamUnavailable,
    error_body,
)
from gateway.relay.failures import describe
from gateway.relay.reading import first_event_of, read_chunk
from gateway.state import DROP_USAGE, REQUEST_ID, RUNTIME, TIMING
from gateway.verify.scan import AnswerScan

log = logging.getLogger("kvfence.gateway.proxy")
SSE: Final = "text/event-stream"
_DONE: Final = b"data: [DONE]"
CLIENT_CLOSED: Final = 499  # the status recorded when the client disconnects mid-stream


async def relay_stream(
    request: web.Request, upstream: aiohttp.ClientResponse, exchange: Exchange
) -> web.StreamResponse:
    ctx, answer = exchange.ctx, exchange.answer
    idle_s = request[RUNTIME].policy.gateway.timeouts.idle_s
    head, pending = b"", b""
    if ctx.attested:
        event, pending = await first_event_of(upstream, idle_s)
        if event is not None:
            request[TIMING].first_event = time.perf_counter()
        token, head = split_attestation_event(event) if event is not None else (None, b"")
        answer.attestations.append(token)
    judgement = judge(ctx, answer)
    if judgement.blocked:
        withheld = await settle(request, ctx, answer, judgement)
        assert withheld is not None
        return withheld
    resp = web.StreamResponse(
        status=upstream.status,
        headers={
            "content-type": SSE,
            "cache-control": "no-cache",
            "x-request-id": request[REQUEST_ID],
            VERDICT_HEADER: judgement.verdict.value,
        },
    )
    await resp.prepare(request)
    request[TIMING].client_headers = time.perf_counter()
    if head:
        exchange.scan.events(head)
        await resp.write(head)
    await _pump(request, upstream, resp, exchange, judgement, pending)
    return resp


class ClientStalled(Exception):
    """The client read nothing for `limits.write_timeout_s` while its stream was waiting."""


async def _send(resp: web.StreamResponse, data: bytes, deadline_s: float) -> None:
    if not data:  # an empty write could end the chunked body early
        return
    try:
        async with asyncio.timeout(deadline_s):
            await resp.write(data)
    except TimeoutError:
        raise ClientStalled from None


async def _pump(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    resp: web.StreamResponse,
    exchange: Exchange,
    judgement: Judgement,
    pending: bytes,
) -> None:
    """Relay events as they complete, each scanned before it is written; hold `[DONE]` back
    until the whole answer is judged and settled."""
    ctx, answer, scan = exchange.ctx, exchange.answer, exchange.scan
    scanner = UsageScanner(drop_usage=request[DROP_USAGE])
    gateway = request[RUNTIME].policy.gateway
    idle_s, write_s = gateway.timeouts.idle_s, gateway.limits.write_timeout_s
    held, suspect = b"", b""
    chunk, timing = pending, request[TIMING]
    try:
        while True:
            out = scanner.feed(chunk) if chunk else b""
            if out and not timing.first_event:
                timing.first_event = time.perf_counter()
            if out:
                scan.events(out)
                if scan.markers or scan.late_attestations:
                    answer.markers, answer.late_attestations = scan.markers, scan.late_attestations
                    judgement = judge(ctx, answer)
                    if judgement.blocked:  # cut before this chunk reaches the client
                        await _fail(request, resp, exchange, judgement, _refused(judgement))
                        return
                # Text that may be the start of a canary marker waits for the next events.
                out, suspect = (b"", suspect + out) if scan.marker_started else (suspect + out, b"")
            cut = -1 if held else _done_at(out)
            if cut >= 0:
                out, held = out[:cut], out[cut:]
            elif held:
                out, held = b"", held + out
            await _send(resp, out, write_s)
            try:
                chunk = await read_chunk(upstream, idle_s)
            except (TimeoutError, aiohttp.ClientError) as exc:
                answer.prompt_tokens = scanner.prompt_tokens
                await _fail(request, resp, exchange, judgement, _cut_error(exc))
                return
            if not chunk:
                break
    except ClientStalled:
        await _left(request, exchange, judgement, scanner, "client_stalled")
        log.info("client stopped reading; stream cut", extra={"rid": ctx.request_id})
        if request.transport is not None:
            request.transport.abort()  # its buffers are full: nothing more can be said
        return
    except (asyncio.CancelledError, ConnectionResetError):
        # The client went away mid-stream: the response still gets its record.
        log.info("client closed the stream", extra={"rid": ctx.request_id})
        await _left(request, exchange, judgement, scanner, "client_closed")
        raise
    answer.prompt_tokens, answer.cached_tokens = scanner.prompt_tokens, scanner.cached_tokens
    answer.total_tokens = scanner.total_tokens
    if not _ended(request.path, held, scan):
        await _fail(request, resp, exchange, judgement, UpstreamUnavailable(
            "the backend's stream ended without its final event (cut short)"))  # fmt: skip
        return
    exchange.finish()
    final = judge(ctx, answer)  # now with the usage: the accounting and the detective's check
    if final.blocked:
        await _fail(request, resp, exchange, final, _refused(final))
        return
    try:
        await settle(request, ctx, answer, final)
    except AuditWriteFailed as exc:
        await _end_with_error(resp, exc)
        return
    try:
        await _send(resp, suspect + held + scanner.tail(), write_s)
    except ClientStalled:
        if request.transport is not None:
            request.transport.abort()
        return
    await resp.write_eof()


def _ended(path: str, held: bytes, scan: AnswerScan) -> bool:
    """The stream ended as the protocol says a complete one does: chat and completions with
    `data: [DONE]`, responses with a terminal event. Anything else was cut short, whatever
    the framing claimed."""
    if path == RESPONSES:
        return scan.terminal
    return bool(held)


async def _left(
    request: web.Request,
    exchange: Exchange,
    judgement: Judgement,
    scanner: UsageScanner,
    reason: str,
) -> None:
    """The client left or stopped reading: the answer is settled with status 499 and `reason`."""
    answer = exchange.answer
    answer.prompt_tokens, answer.cached_tokens = scanner.prompt_tokens, scanner.cached_tokens
    left = settle(request, exchange.ctx, answer, judgement, status=CLIENT_CLOSED, reason=reason)
    with contextlib.suppress(AuditWriteFailed):
        await asyncio.shield(left)


def _refused(judgement: Judgement) -> GatewayError:
    return AttestationRefused(
        f"the rest of the answer was withheld: its audit verdict is {judgement.verdict.value}"
    )


def _cut_error(exc: BaseException) -> GatewayError:
    if isinstance(exc, TimeoutError):
        return UpstreamTimeout("backend stalled mid-stream", cause="stalled: no event in idle_s")
    return UpstreamUnavailable("backend failed mid-stream", cause=describe(exc))


async def _fail(
    request: web.Request,
    resp: web.StreamResponse,
    exchange: Exchange,
    judgement: Judgement,
    error: GatewayError,
) -> None:
    ctx, answer = exchange.ctx, exchange.answer
    cause = error.cause or "-"
    log.warning("stream cut", extra={"rid": ctx.request_id, "error": error.code, "cause": cause})
    with contextlib.suppress(AuditWriteFailed):  # logged and counted; the stream fails anyway
        await settle(request, ctx, answer, judgement, status=error.status, reason=error.code)
    await _end_with_error(resp, error)


async def _end_with_error(resp: web.StreamResponse, error: GatewayError) -> None:
    """An `error` event, never `[DONE]`, then a properly ended body: the connection stays usable
    (keep-alive), and no client takes the truncated answer for a complete one."""
    with contextlib.suppress(ConnectionResetError):
        async with asyncio.timeout(5):
            await resp.write(b"\n\nevent: error\ndata: " + error_body(error) + b"\n\n")
            await resp.write_eof()


def _done_at(events: bytes) -> int:
    """Where a `data: [DONE]` line starts in complete events, or -1 (text inside a JSON string
    never follows a raw newline, so it cannot match)."""
    at = events.find(_DONE)
    while at > 0 and events[at - 1 : at] != b"\n":
        at = events.find(_DONE, at + 1)
    return at
