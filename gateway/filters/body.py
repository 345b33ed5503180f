"""Body reading: size-limited, deadline-bound, parsed as one JSON object.

Parsing and later re-serialising means duplicate keys and parser quirks never reach a backend;
integers beyond 64 bits are kept exact (`gateway.inputs.jsonbody`). A body whose framing breaks
while it is read (a bad chunk, bad compression) is a 400, counted as malformed, never a 500.

A compressed body (`Content-Encoding: gzip` or `deflate`, one layer) is decoded as it arrives,
in bounded steps, and the size cap counts the decoded bytes, so a compression bomb is a 413 after
at most the cap; any other encoding is a 415 before a byte of the body is read.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from gateway.errors import (
    BadRequest,
    BodyTooLarge,
    MalformedBody,
    RequestTimeout,
    UnsupportedEncoding,
)
from gateway.inputs import jsonbody
from gateway.listener.edge import EDGE
from gateway.state import BODY, RECEIVED_BODY, RUNTIME

ENCODINGS = frozenset({"", "identity", "gzip", "x-gzip", "deflate"})


async def _read_limited(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(f"request body over {limit} bytes")
    data = bytearray()
    while chunk := await request.content.readany():
        data += chunk
        if len(data) > limit:
            raise BodyTooLarge(f"request body over {limit} bytes")
    return bytes(data)


def _arrived(request: web.Request, limit: int) -> bytes | None:
    """The whole body when it has already arrived (no wait, so no deadline), else None."""
    if not request.content.is_eof():
        return None
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(f"request body over {limit} bytes")
    data = request.content.read_nowait()
    if len(data) > limit:
        raise BodyTooLarge(f"request body over {limit} bytes")
    return data


def _check_encoding(request: web.Request) -> None:
    encodings = request.headers.getall("content-encoding", [])
    if len(encodings) > 1 or (encodings and encodings[0].strip().lower() not in ENCODINGS):
        raise UnsupportedEncoding(
            "request bodies may be sent as is or with Content-Encoding gzip or deflate"
        )


async def read_body(request: web.Request) -> None:
    _check_encoding(request)
    limits = request[RUNTIME].policy.gateway.limits
    try:
        raw = _arrived(request, limits.max_body_bytes)
        if raw is None:
            async with asyncio.timeout(limits.body_timeout_s):
                raw = await _read_limited(request, limits.max_body_bytes)
    except TimeoutError:
        raise RequestTimeout("request body not received in time") from None
    except web.RequestPayloadError:
        request.app[EDGE].refused("body")
        raise MalformedBody("the request body could not be read (framing or encoding)") from None
    try:
        body = jsonbody.loads(raw)
    except ValueError:
        raise BadRequest("the request body must be JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    request[BODY] = body
    request[RECEIVED_BODY] = raw
