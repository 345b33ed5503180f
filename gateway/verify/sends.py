"""One canary send in any shape: chat, completions or Responses, streamed or not, timed from
the send to the first token (a plain answer: to its whole body), with the cached tokens the
server reported, per tier where it splits them (SGLang's `cached_tokens_details`).

Invariant: a send is never retried and never read as a miss when it failed: a timeout, a
refused connection or an error status raises `SendFailed`, and the round it belongs to is
`inconclusive`; a retry could hit what the abandoned send cached under its own salt.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from gateway.audit.sse import Reader, events
from gateway.inputs.paths import RESPONSES
from kvfence.probe.client import Identity
from kvfence.probe.errors import ProbeError


class SendFailed(ProbeError):
    """A canary send got no complete answer (its message names no secret)."""


@dataclass(frozen=True, slots=True)
class Sent:
    ttft_s: float
    cached: int | None  # None: the server reported no cached-token count
    prompt: int | None
    tiers: tuple[tuple[str, int], ...] = ()  # cached tokens per tier, where reported

    @property
    def hit(self) -> int:
        """The most cached tokens any count reports (a tier's may exceed the total's)."""
        return max([self.cached or 0, *(n for _, n in self.tiers)])


def usage_counts(usage: Any) -> tuple[int | None, int | None, tuple[tuple[str, int], ...]]:
    """(prompt tokens, cached tokens, cached tokens per tier) of a usage object."""
    if not isinstance(usage, dict):
        return None, None, ()
    prompt = next((usage[k] for k in ("prompt_tokens", "input_tokens") if _int(usage.get(k))), None)
    cached = None
    tiers: dict[str, int] = {}
    for key in ("prompt_tokens_details", "input_tokens_details"):
        details = usage.get(key)
        if isinstance(details, dict):
            cached = details.get("cached_tokens") if _int(details.get("cached_tokens")) else cached
            tiers.update(_tiers(details.get("cached_tokens_details")))
    tiers.update(_tiers(usage.get("cached_tokens_details")))
    return prompt, cached, tuple(sorted(tiers.items()))


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tiers(found: Any) -> dict[str, int]:
    if not isinstance(found, dict):
        return {}
    return {str(k): v for k, v in found.items() if _int(v)}


async def send(
    session: aiohttp.ClientSession,
    url: str,
    identity: Identity,
    body: dict[str, Any],
    timeout_s: float,
) -> Sent:
    """POST `body` (scoped by `identity`) to `url` once."""
    payload = orjson.dumps({**body, **dict(identity.body)})
    headers = {"content-type": "application/json", **identity.request_headers()}
    streamed = bool(body.get("stream"))
    try:
        started = time.perf_counter()
        async with session.post(
            url, data=payload, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            if resp.status != 200:
                await resp.read()
                raise SendFailed(f"a canary send got HTTP {resp.status} (never retried)")
            if not streamed:
                doc = orjson.loads(await resp.read())
                ttft = time.perf_counter() - started
                return _sent(ttft, doc.get("usage") if isinstance(doc, dict) else None)
            return await _stream(resp, started, url.endswith(RESPONSES))
    except TimeoutError:
        raise SendFailed(
            f"a canary send had no answer within {timeout_s:g} s (not retried)"
        ) from None
    except orjson.JSONDecodeError:
        raise SendFailed("a canary send's answer was not JSON") from None
    except aiohttp.ClientError as exc:
        raise SendFailed(f"a canary send failed ({type(exc).__name__}; not retried)") from None


def _sent(ttft: float, usage: Any) -> Sent:
    prompt, cached, tiers = usage_counts(usage)
    return Sent(ttft, cached, prompt, tiers)


async def _stream(resp: aiohttp.ClientResponse, started: float, responses: bool) -> Sent:
    ttft: float | None = None
    usage: Any = None
    reader = Reader()
    async for chunk in resp.content.iter_any():
        ttft, usage = _read(reader.feed(chunk), started, responses, ttft, usage)
    ttft, usage = _read(reader.end(), started, responses, ttft, usage)  # a last event unended
    if ttft is None:
        raise SendFailed("a canary stream ended before its first token")
    return _sent(ttft, usage)


def _read(
    complete: bytes, started: float, responses: bool, ttft: float | None, usage: Any
) -> tuple[float | None, Any]:
    """Complete events read: the time to the first token and the last usage reported, so far.
    Raises SendFailed on an error event."""
    for event in events(complete):
        data = event.data.strip() if event.data is not None else b""
        if not data.startswith(b"{"):  # `[DONE]`, or not JSON
            continue
        doc = orjson.loads(data)
        if not isinstance(doc, dict) or doc.get("error"):
            raise SendFailed("a canary stream ended with an error event")
        if ttft is None and (doc.get("choices") or _delta(doc, responses)):
            ttft = time.perf_counter() - started
        if isinstance(doc.get("usage"), dict):
            usage = doc["usage"]
        elif responses and doc.get("type") == "response.completed":
            usage = (doc.get("response") or {}).get("usage")
    return ttft, usage


def _delta(event: dict[str, Any], responses: bool) -> bool:
    return responses and str(event.get("type", "")).endswith(".delta")
