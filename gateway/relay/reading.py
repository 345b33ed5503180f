"""Reading an upstream answer: what arrived, with a deadline only when something must be
waited for, and a stream's first event (where our backend puts its attestation).

Invariant: no read waits longer than the idle deadline it is given.
"""

from __future__ import annotations

import asyncio
from typing import Final

import aiohttp

from gateway.audit.usage import first_event
from gateway.errors import UpstreamTimeout, UpstreamUnavailable

MAX_FIRST_EVENT: Final = 64 * 1024  # the attestation event is a few hundred bytes


async def read_chunk(upstream: aiohttp.ClientResponse, idle_s: float) -> bytes:
    """What arrived since the last read (b"" at the end); waits at most `idle_s` for more.
    Data already buffered, or the end, is taken without arming a deadline (nothing waits)."""
    content = upstream.content
    data = content.read_nowait()
    if data or content.is_eof():
        return data
    async with asyncio.timeout(idle_s):
        return await content.readany()


async def first_event_of(
    upstream: aiohttp.ClientResponse, idle_s: float
) -> tuple[bytes | None, bytes]:
    """The upstream's first SSE event and what followed it; (None, all) if it never completed."""
    buf = b""
    try:
        while len(buf) <= MAX_FIRST_EVENT:
            found = first_event(buf)
            if found is not None:
                return found
            chunk = await read_chunk(upstream, idle_s)
            if not chunk:
                break
            buf += chunk
    except TimeoutError:
        raise UpstreamTimeout("backend stalled before its attestation") from None
    except aiohttp.ClientError:
        raise UpstreamUnavailable("backend failed before its attestation") from None
    return None, buf
