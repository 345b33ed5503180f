"""One tenant's allowance as both limits tables hold it (this gateway's `local_limits`, every
replica's `limits` in Redis): a token bucket for requests per second, one for tokens per minute,
and the requests in flight; the one rule that admits, refuses and charges. Pure: no I/O.

Invariant: both tables decide through `admit`, `hold` and `charge` here and nowhere else, so a
tenant's allowance is the same rule wherever it is held; a refusal says how long to wait.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from gateway.policy.tenant_model import TenantLimits


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str  # requests_per_s | concurrent | tokens_per_min
    retry_after_s: float


@dataclass(frozen=True, slots=True)
class Allowance:
    """`rps` and `tpm` are the buckets' levels at `rps_at` and `tpm_at` (inf: a fresh bucket,
    full at its first use); `flight` the requests in flight."""

    rps: float = math.inf
    rps_at: float = 0.0
    tpm: float = math.inf
    tpm_at: float = 0.0
    flight: int = 0


FRESH = Allowance()


def _refill(level: float, since: float, now: float, rate: float, cap: float) -> float:
    if rate <= 0:
        return math.inf
    if math.isinf(level):
        return cap  # a fresh bucket starts full
    return min(cap, level + max(0.0, now - since) * rate)


def admit(state: Allowance, limits: TenantLimits, now: float) -> tuple[Allowance, Refusal | None]:
    """Take one request's allowance (the new state), or say why not and for how long (the
    state refilled to `now`, nothing taken)."""
    rps = _refill(state.rps, state.rps_at, now, limits.requests_per_s, limits.burst)
    tpm = _refill(state.tpm, state.tpm_at, now, limits.tokens_per_min / 60.0, limits.tokens_per_min)
    refusal = None
    if limits.concurrent and state.flight >= limits.concurrent:
        refusal = Refusal("concurrent", 1.0)
    elif limits.requests_per_s and rps < 1.0:
        refusal = Refusal("requests_per_s", (1.0 - rps) / limits.requests_per_s)
    elif limits.tokens_per_min and tpm <= 0.0:
        refusal = Refusal("tokens_per_min", -tpm / (limits.tokens_per_min / 60.0) + 0.001)
    flight = state.flight
    if refusal is None:
        rps, flight = rps - 1.0, flight + 1
    return Allowance(rps, now, tpm, now, flight), refusal


def hold(
    state: Allowance, limits: TenantLimits, tokens: int, now: float
) -> tuple[Allowance, Refusal | None]:
    """Hold `tokens` of the tokens-per-minute bucket for an admitted request (its reservation),
    refused while the bucket is empty, so concurrent requests overdraw it by at most one
    reservation; `charge` later takes what the request used less what it held."""
    if not limits.tokens_per_min:
        return state, None
    rate = limits.tokens_per_min / 60.0
    tpm = _refill(state.tpm, state.tpm_at, now, rate, limits.tokens_per_min)
    if tpm <= 0.0:
        return replace(state, tpm=tpm, tpm_at=now), Refusal("tokens_per_min", -tpm / rate + 0.001)
    return replace(state, tpm=tpm - tokens, tpm_at=now), None


def charge(state: Allowance, tokens: int) -> Allowance:
    """A request ended: its slot in flight is free and its tokens are charged."""
    return replace(state, tpm=state.tpm - tokens, flight=max(0, state.flight - 1))
