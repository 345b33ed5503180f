"""Reading an upstream answer: what arrived, within a deadline (the answer's `Watch`); a plain
answer whole (it is judged before its first byte is sent), and a stream's first event (where
our backend puts its attestation).

Invariant: no read waits longer than the idle deadline it is given; a failed read is an
UpstreamTimeout or UpstreamUnavailable that names how it failed.
"""

from __future__ import annotations

import asyncio
from typing import Final

import aiohttp

from gateway.audit import sse
from gateway.errors import AnswerTooLarge, UpstreamTimeout, UpstreamUnavailable
from gateway.policy.model import Timeouts
from gateway.relay.client import Answer
from gateway.relay.failures import describe
from gateway.relay.watch import Watch

MAX_FIRST_EVENT: Final = 64 * 1024  # the attestation event is a few hundred bytes


async def read_chunk(upstream: Answer, watch: Watch, idle_s: float) -> bytes:
    """What arrived since the last read (b"" at the end); waits at most `idle_s` for more.
    Arming the watch sets no timer (see `Watch`), so data already buffered costs no check of
    its own: `readany` takes it without waiting."""
    with watch.within(idle_s):
        return await upstream.readany()


async def first_event_of(
    upstream: Answer, watch: Watch, idle_s: float
) -> tuple[bytes | None, bytes]:
    """The upstream's first SSE event (with its blank line) and what followed it; (None, all)
    if it never completed."""
    buf = b""
    try:
        while len(buf) <= MAX_FIRST_EVENT:
            found = sse.first(buf)
            if found is not None:
                return found
            chunk = await read_chunk(upstream, watch, idle_s)
            if not chunk:
                break
            buf += chunk
    except TimeoutError:
        raise UpstreamTimeout("backend stalled before its attestation") from None
    except aiohttp.ClientError:
        raise UpstreamUnavailable("backend failed before its attestation") from None
    return None, buf


async def read_all(
    upstream: Answer, watch: Watch, timeouts: Timeouts, cap: int, until: float
) -> bytes:
    """The whole plain answer, at most `cap` bytes: each read within `timeouts.idle_s`, all of
    it by the loop time `until` (`timeouts.total_s` after it was sent)."""
    parts: list[bytes] = []
    size = 0
    idle_s, now = timeouts.idle_s, asyncio.get_running_loop().time
    total = False  # the read waiting now ends at `until`, not idle_s after it began
    try:
        while True:
            left_s = until - now()
            total = left_s <= idle_s
            chunk = await read_chunk(upstream, watch, max(left_s, 0.0) if total else idle_s)
            if not chunk:
                break
            size += len(chunk)
            if size > cap:
                raise AnswerTooLarge(f"the backend's answer is over {cap} bytes")
            parts.append(chunk)
    except TimeoutError:
        if total:
            cause = f"not done within timeouts.total_s ({timeouts.total_s:g} s)"
            message = "backend did not finish its answer in time"
            raise UpstreamTimeout(message, cause=cause) from None
        cause = f"stalled: no data within timeouts.idle_s ({idle_s:g} s)"
        raise UpstreamTimeout("backend stalled while answering", cause=cause) from None
    except aiohttp.ClientError as exc:
        cause = describe(exc)
        raise UpstreamUnavailable("backend failed while answering", cause=cause) from None
    return b"".join(parts)
