"""The terminal step: send the scoped request upstream, judge the answer, relay it.

Invariant: no byte of an answer reaches the client before its verdict is known, and the audit
record is written before the answer completes; a stream that fails after it started ends with an
SSE error event and a closed connection, never with `[DONE]`, so a truncated answer cannot look
complete.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from gateway.audit import VERDICT_HEADER, AuditContext, HandleRefused, Outcome, Verdict
from gateway.audit_request import audit, context, local_answer, refusal
from gateway.errors import UpstreamTimeout, UpstreamUnavailable
from gateway.policy import Timeouts
from gateway.sse import cached_tokens, prompt_tokens
from gateway.state import BODY, REQUEST_ID, ROUTE, RUNTIME, TIMING, UPSTREAM_HEADERS
from gateway.stream_relay import SSE, read_chunk, relay_stream
from kvfence.handle import ATTESTATION_HEADER

SESSION = web.AppKey("kvfence_upstream_session", aiohttp.ClientSession)
log = logging.getLogger("kvfence.gateway.proxy")


async def _open(request: web.Request, timeouts: Timeouts) -> aiohttp.ClientResponse:
    route = request[ROUTE]
    data = orjson.dumps(request[BODY])
    request[TIMING].upstream_sent = time.perf_counter()
    try:
        async with asyncio.timeout(timeouts.first_byte_s):
            return await request.app[SESSION].post(
                route.backend.url + request.path,
                data=data,
                headers=request[UPSTREAM_HEADERS],
                timeout=request[RUNTIME].upstream_timeout,
            )
    except TimeoutError:
        raise UpstreamTimeout(f"backend {route.backend.name} did not answer in time") from None
    except aiohttp.ClientError:
        raise UpstreamUnavailable(f"backend {route.backend.name} is unavailable") from None


def _usage_of(body: bytes) -> tuple[int | None, int | None]:
    if b'"usage"' not in body:
        return None, None
    try:
        usage: Any = orjson.loads(body).get("usage")
    except (orjson.JSONDecodeError, AttributeError):
        return None, None
    return prompt_tokens(usage), cached_tokens(usage)


async def _relay_body(
    request: web.Request, upstream: aiohttp.ClientResponse, ctx: AuditContext
) -> web.Response:
    idle_s = request[RUNTIME].policy.gateway.timeouts.idle_s
    parts: list[bytes] = []
    try:
        while chunk := await read_chunk(upstream, idle_s):
            parts.append(chunk)
    except TimeoutError:
        raise UpstreamTimeout("backend stalled while answering") from None
    except aiohttp.ClientError:
        raise UpstreamUnavailable("backend failed while answering") from None
    body = b"".join(parts)
    ok = upstream.status == 200
    # Error answers carry no generated text, so there is nothing to attest.
    outcome = (
        ctx.judge(upstream.headers.get(ATTESTATION_HEADER)) if ok else Outcome(Verdict.UNATTESTED)
    )
    status = 502 if outcome.blocked else upstream.status
    await audit(request, ctx, outcome, status, _usage_of(body) if ok else (None, None))
    request[TIMING].client_headers = time.perf_counter()
    if outcome.blocked:
        return local_answer(request, refusal(outcome), outcome.verdict)
    return web.Response(
        body=body,
        status=upstream.status,
        headers={
            "content-type": upstream.content_type,
            "x-request-id": request[REQUEST_ID],
            VERDICT_HEADER: outcome.verdict.value,
        },
    )


async def forward(request: web.Request) -> web.StreamResponse:
    ctx = context(request)
    upstream = await _open(request, request[RUNTIME].policy.gateway.timeouts)
    request[TIMING].upstream_headers = time.perf_counter()
    try:
        if ctx.attested and upstream.status in (401, 403):
            # The backend refused the gateway's own handle: a key or audience misconfiguration.
            log.error("backend refused the handle", extra={"rid": request[REQUEST_ID]})
            await audit(request, ctx, Outcome(Verdict.UNATTESTED), 502, (None, None))
            raise HandleRefused(f"backend {ctx.backend.name} refused the gateway's handle")
        if upstream.status == 200 and upstream.content_type == SSE:
            return await relay_stream(request, upstream, ctx)
        return await _relay_body(request, upstream, ctx)
    finally:
        upstream.release()
