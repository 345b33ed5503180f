"""Why an external server's answer got its verdict, in the stable form the audit record, the
verdict-reason metrics and (through the exchange) signed receipts carry: the last canary round
(id, time, outcome, how it decided, the shapes recent rounds covered) and the detective's
finding. Pure. docs/verify.md ("Evidence") documents every field.

Invariant: `canary_reason` is the one place that says whether the canary state lets an answer
be `verified`: "" when it does, else why not.
"""

from __future__ import annotations

from typing import Any, Final

from gateway.fleet.local_health import Health
from gateway.policy.backend_model import Backend
from gateway.verify.canary import HONEST
from gateway.verify.detective import Finding

FRESH_ROUNDS: Final = 3  # a canary outcome counts for this many intervals
VERSION: Final = 1

# Why an answer is `unverified` (the canary state does not vouch for it).
CANARY_OFF: Final = "canary_off"
NO_ROUND: Final = "no_round"
INCONCLUSIVE: Final = "round_inconclusive"
SHARED: Final = "round_shared"
STALE: Final = "round_stale"


def canary_reason(backend: Backend, health: Health | None, now: float) -> str:
    """ "" when the last round was isolated and is fresh, else why the answer is unverified."""
    canary = backend.verify.canary if backend.verify else None
    if canary is None:
        return CANARY_OFF
    if health is None or health.canary == "none":
        return NO_ROUND
    if health.canary == "inconclusive":
        return INCONCLUSIVE
    if health.canary != "isolated":
        return SHARED
    if now - health.canary_at > FRESH_ROUNDS * canary.interval_s:
        return STALE
    return ""


def counter_trusted(backend: Backend, health: Health | None) -> bool:
    """Whether the detective may judge the server's cached-token counts: a canary round saw
    them behave as cache-hit counts (A's cold send 0, its repeat a hit), or canaries are off
    and the policy relies on the detective alone. A count that reports hits on cold requests
    (disaggregated prefill) proves nothing, and is never a violation."""
    canary = backend.verify.canary if backend.verify else None
    return canary is None or (health is not None and health.counter == HONEST)


def evidence(
    backend: Backend, health: Health | None, finding: Finding | None, now: float
) -> dict[str, Any]:
    """The evidence behind an external server's verdict (version 1)."""
    canary = None
    if health is not None and health.canary != "none":
        canary = {
            "id": health.canary_id,
            "at": round(health.canary_at, 3),
            "outcome": health.canary,
            "by": health.canary_by,
            "shapes": list(health.canary_shapes),
            "counter": health.counter,
        }
    return {
        "version": VERSION,
        "canary": canary,
        "canary_reason": canary_reason(backend, health, now),
        "detective": finding.as_json() if finding is not None and finding.reason else None,
    }
