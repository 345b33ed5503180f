"""One canary round against an external backend: a fresh random prompt (several cache blocks,
carrying a live marker) sent twice in reserved canary namespace A and once in B. The second A
must hit (the positive control); B must not, by reported cached tokens or by first-token time.

Invariant: `isolated` needs a passing control; anything the round cannot tell (no cache hit on
A's repeat, no usage and timing that does not separate) is `inconclusive`, never a pass.
"""

from __future__ import annotations

import secrets
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from gateway.adapters.base import Adapter
from gateway.policy.backend_model import Backend, CanarySettings, ModelSpec
from gateway.verify.markers import MarkerKey
from kvfence.namespace import NamespaceKey, canary_namespace
from kvfence.probe.client import Api, Endpoint, Identity, Observation, Sender, make_sender
from kvfence.probe.outcome import Outcome
from kvfence.probe.pacing import RetryPolicy
from kvfence.probe.prompts import Prompt, PromptFactory

CLEAR_GAP = 0.7  # a hit is "clearly" faster: at most this share of a miss's first-token time
NEAR = 0.3  # B's median within this share of the hit-miss gap of one side: it is that side


@dataclass(frozen=True, slots=True)
class Sample:
    """One prompt of a round: A's first send (a miss), A's repeat (must hit), B's send."""

    first: Observation
    repeat: Observation
    other: Observation


@dataclass(frozen=True, slots=True)
class Result:
    backend: str
    model: str
    outcome: Outcome
    reason: str
    by: str  # "cached_tokens" or "timing"
    requests: int


def decide(samples: Sequence[Sample]) -> tuple[Outcome, str, str]:
    """The round's outcome from its samples (pure)."""
    if all(s.repeat.cached_tokens is not None for s in samples):
        if any(s.other.cached_tokens for s in samples):
            return (
                Outcome.SHARED,
                "namespace B reported cached tokens on A's prompt",
                "cached_tokens",
            )
        if not all(s.repeat.cached_tokens for s in samples):
            return (
                Outcome.INCONCLUSIVE,
                "A's repeat reported no cached tokens (prefix caching off, or the prompt shorter "
                "than a cache block)",
                "cached_tokens",
            )
        return Outcome.ISOLATED, "A's repeat hit, B's send did not", "cached_tokens"
    miss = [s.first.ttft_s for s in samples]
    hit = [s.repeat.ttft_s for s in samples]
    other = [s.other.ttft_s for s in samples]
    slow, fast = statistics.median(miss), statistics.median(hit)
    if not (max(hit) < min(miss) and fast <= CLEAR_GAP * slow):
        return (
            Outcome.INCONCLUSIVE,
            "no cached-token count, and A's repeats were not clearly faster than its first sends",
            "timing",
        )
    gap, typical = slow - fast, statistics.median(other)
    if max(other) < min(miss) and typical <= fast + NEAR * gap:
        return Outcome.SHARED, "B's first-token times look like A's cache hits", "timing"
    if min(other) > max(hit) and typical >= slow - NEAR * gap:
        return Outcome.ISOLATED, "B's first-token times look like misses", "timing"
    return Outcome.INCONCLUSIVE, "B's first-token times fall between hits and misses", "timing"


def identity(adapter: Adapter, backend: Backend, path: str, namespace: str, name: str) -> Identity:
    """The canary's credential: the namespace injected exactly as for a tenant's request."""
    body: dict[str, Any] = {}
    headers: dict[str, str] = {}
    adapter.inject(path, body, headers, namespace)
    key = backend.api_key.value.decode() if backend.api_key is not None else None
    return Identity(name, key, tuple(headers.items()), tuple(body.items()))


async def run_round(
    session: aiohttp.ClientSession,
    route_adapter: Adapter,
    backend: Backend,
    model: ModelSpec,
    settings: CanarySettings,
    key: NamespaceKey,
    markers: MarkerKey,
    timeout_s: float,
) -> Result:
    """One round (raises the probe client's errors when the backend cannot be reached)."""
    round_id = secrets.token_hex(8)
    path = "/v1/chat/completions"
    a, b = (
        identity(
            route_adapter,
            backend,
            path,
            canary_namespace(key, backend.name, model.name, arm, round_id),
            arm,
        )
        for arm in ("a", "b")
    )
    send = make_sender(
        session, Endpoint(backend.url, model.name, Api.CHAT, timeout_s), RetryPolicy(attempts=2)
    )
    factory = PromptFactory(settings.prompt_tokens)
    samples = [await _sample(send, factory, markers, a, b)]
    if samples[0].repeat.cached_tokens is None:  # no usage: time more prompts
        for _ in range(settings.timing_samples - 1):
            samples.append(await _sample(send, factory, markers, a, b))
    outcome, reason, by = decide(samples)
    return Result(backend.name, model.name, outcome, reason, by, 3 * len(samples))


async def _sample(
    send: Sender, factory: PromptFactory, markers: MarkerKey, a: Identity, b: Identity
) -> Sample:
    prompt = Prompt(markers.mint(), factory.fresh().letters)
    first = await send(a, prompt.text)
    repeat = await send(a, prompt.text)
    other = await send(b, prompt.text)
    return Sample(first, repeat, other)
