"""One timed request: a streaming completion with `max_tokens: 1` and usage asked for, timed from
the send to the first chunk that carries a choice, with the `cached_tokens` the server reported.

Invariant: the caller owns the aiohttp session and the credentials arrive as an `Identity`, so
nothing here is global; an `Identity`'s key and header values never appear in its repr, in an
error message or in anything `describe()` returns.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson
from aiohttp.http_exceptions import HttpProcessingError

from kvfence.probe.errors import (
    TRANSIENT_STATUSES,
    GaveUp,
    ProtocolError,
    Retryable,
    failure,
    server_message,
)
from kvfence.probe.pacing import Pacer, RetryPolicy, retry_after_s


class Api(StrEnum):
    CHAT = "chat"
    COMPLETIONS = "completions"


@dataclass(frozen=True, slots=True)
class Identity:
    """One side of the probe: an optional API key, extra headers and extra body fields (for
    endpoints that scope the cache by user, session or `cache_salt`)."""

    name: str
    key: str | None = field(default=None, repr=False)
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    body: tuple[tuple[str, Any], ...] = field(default=(), repr=False)

    def request_headers(self) -> dict[str, str]:
        out = {"authorization": f"Bearer {self.key}"} if self.key else {}
        out.update(self.headers)
        return out

    def secrets(self) -> tuple[str, ...]:
        """Everything to scrub from quoted server text: the key and every header value."""
        return tuple(s for s in (self.key, *(v for _, v in self.headers)) if s)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key is not None,
            "headers": sorted({k.lower() for k, _ in self.headers}),
            "body_fields": sorted({k for k, _ in self.body}),
        }


@dataclass(frozen=True, slots=True)
class Endpoint:
    base_url: str  # with or without a trailing /v1 (or other /vN)
    model: str
    api: Api = Api.CHAT
    timeout_s: float = 120.0

    @property
    def url(self) -> str:
        base = self.base_url.rstrip("/")
        if not re.search(r"/v\d+$", urlsplit(base).path):
            base += "/v1"
        return base + ("/chat/completions" if self.api is Api.CHAT else "/completions")

    def safe_url(self) -> str:
        """The URL without user info, query or fragment (those may carry credentials)."""
        parts = urlsplit(self.base_url)
        return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


@dataclass(frozen=True, slots=True)
class Observation:
    ttft_s: float  # send -> first chunk with a choice, on the attempt that succeeded
    cached_tokens: int | None  # None: the endpoint reported no cached-token count
    prompt_tokens: int | None
    attempts: int


Sender = Callable[[Identity, str], Awaitable[Observation]]


def request_body(endpoint: Endpoint, identity: Identity, text: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": endpoint.model, "max_tokens": 1, "temperature": 0}
    if endpoint.api is Api.CHAT:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    body.update(identity.body)  # last, so an endpoint's own field names can win
    return body


def read_usage(usage: dict[str, Any]) -> tuple[int | None, int | None]:
    """(prompt_tokens, cached_tokens): OpenAI's `prompt_tokens_details.cached_tokens`, or
    DeepSeek's `prompt_cache_hit_tokens`; None where the server sent neither."""
    prompt = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None:
        cached = usage.get("prompt_cache_hit_tokens")
    return _count(prompt), _count(cached)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def make_sender(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    retry: RetryPolicy | None = None,
    pacer: Pacer | None = None,
) -> Sender:
    policy = retry or RetryPolicy()

    async def sender(identity: Identity, text: str) -> Observation:
        return await send(session, endpoint, identity, text, policy, pacer)

    return sender


async def send(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    identity: Identity,
    text: str,
    retry: RetryPolicy,
    pacer: Pacer | None = None,
) -> Observation:
    """One measurement, retried on 429 (after Retry-After) and transient failures."""
    for attempt in range(1, retry.attempts + 1):
        if pacer is not None:
            await pacer.wait()
        try:
            ttft, usage = await _attempt(session, endpoint, identity, text)
        except Retryable as exc:
            if attempt == retry.attempts:
                raise GaveUp(f"credential {identity.name}: {exc} ({attempt} attempts)") from None
            if exc.wait_s is not None and exc.wait_s > retry.max_wait_s:
                raise GaveUp(f"{exc}; the endpoint asks to wait {exc.wait_s:.0f} s") from None
            await retry.sleep(exc.wait_s if exc.wait_s is not None else retry.backoff(attempt))
            continue
        prompt, cached = read_usage(usage)
        return Observation(ttft, cached, prompt, attempt)
    raise AssertionError("unreachable")  # the loop returns or raises


async def _attempt(
    session: aiohttp.ClientSession, endpoint: Endpoint, identity: Identity, text: str
) -> tuple[float, dict[str, Any]]:
    body = orjson.dumps(request_body(endpoint, identity, text))
    headers = {"content-type": "application/json", **identity.request_headers()}
    timeout = aiohttp.ClientTimeout(total=endpoint.timeout_s)
    try:
        started = time.perf_counter()
        async with session.post(endpoint.url, data=body, headers=headers, timeout=timeout) as resp:
            if resp.status != 200:
                raw = await resp.read()
                if resp.status == 429 or resp.status in TRANSIENT_STATUSES:
                    wait = retry_after_s(resp.headers.get("retry-after"))
                    said = server_message(raw, identity.secrets())
                    raise Retryable(f"HTTP {resp.status} {said}".strip(), wait)
                raise failure(resp.status, raw, identity.name, endpoint.model, identity.secrets())
            if not resp.headers.get("content-type", "").startswith("text/event-stream"):
                raise ProtocolError("the endpoint answered without streaming (stream: true)")
            return await _read_stream(resp, started, identity)
    except TimeoutError:
        raise Retryable(f"no complete answer within {endpoint.timeout_s:g} s") from None
    except HttpProcessingError:  # e.g. a line longer than aiohttp will buffer
        raise ProtocolError("the endpoint sent a malformed or oversized stream") from None
    except aiohttp.ClientConnectorError as exc:
        raise Retryable(f"cannot connect to {exc.host}:{exc.port}") from None
    except aiohttp.ClientError as exc:  # the type only: some messages quote the whole URL
        raise Retryable(f"connection failed ({type(exc).__name__})") from None


async def _read_stream(
    resp: aiohttp.ClientResponse, started: float, identity: Identity
) -> tuple[float, dict[str, Any]]:
    ttft: float | None = None
    usage: dict[str, Any] = {}
    done = False
    # Read to the end even after [DONE]: a body left unread closes the connection instead of
    # returning it to the pool, and a fresh connect per request would add noise to the timing.
    async for line in resp.content:
        if done or not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            continue
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise ProtocolError("the stream carried an event that is not JSON") from None
        if not isinstance(chunk, dict):
            raise ProtocolError("the stream carried an event that is not a JSON object")
        if chunk.get("error"):
            raise Retryable(
                "the stream ended with an error: " + server_message(data, identity.secrets())
            )
        if ttft is None and chunk.get("choices"):
            ttft = time.perf_counter() - started
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
    if ttft is None:
        raise Retryable("the stream ended before its first token")
    return ttft, usage
