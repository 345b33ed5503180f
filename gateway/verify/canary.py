"""One canary round against an external backend, in one request shape: a fresh random prompt
(carrying a live marker) sent in a fresh canary namespace A, repeated there, and sent once in
a fresh namespace B. A's repeat must hit (the positive control); B must not, by any count the
server reports (the total or a tier's). When the count cannot decide (A's repeat reports no
hit, or A's cold send reports one), the round decides by first-token time (`timing`).

Invariant: `isolated` needs a passing control; a failed send, a count that cannot decide and
timing that cannot decide are `inconclusive`, never a pass; no send is retried, and every
namespace B sends in once, so nothing B sees can come from B's own earlier sends.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any, Final

from gateway.policy.backend_model import CanarySettings
from gateway.verify.sends import Sent
from gateway.verify.shapes import Shape
from gateway.verify.target import Target, canary_text
from gateway.verify.timing import timing_round
from kvfence.probe.outcome import Outcome
from kvfence.probe.prompts import PromptFactory

# What a round learned of the server's cached-token count (Health.counter).
HONEST: Final = "honest"  # A's cold send reported 0 and its repeat a hit
COLD_HITS: Final = "cold_hits"  # A's cold send reported a hit: the count proves nothing
SILENT: Final = "silent"  # A's repeat reported no hit (caching off, or a count that lies)
ABSENT: Final = "absent"  # no count at all


@dataclass(frozen=True, slots=True)
class Sample:
    """One prompt of a counter round: A's first send (cold), A's repeat, B's send."""

    first: Sent
    repeat: Sent
    other: Sent


@dataclass(frozen=True, slots=True)
class Result:
    backend: str
    model: str
    outcome: Outcome
    reason: str
    by: str  # "cached_tokens", "timing", or "-" (no send completed)
    requests: int
    round_id: str = ""
    shape: str = ""  # the shape's label
    counter: str = ""  # HONEST, COLD_HITS, SILENT, ABSENT, or "" (not learned)
    trigger: str = "schedule"  # "schedule", "tenant", "operator" or "confirm"
    at: float = 0.0

    def evidence(self) -> dict[str, Any]:
        """The round as a receipt or /status names it (docs/verify.md, "Evidence")."""
        return {
            "id": self.round_id,
            "at": self.at,
            "outcome": self.outcome.value,
            "by": self.by,
            "shape": self.shape,
            "trigger": self.trigger,
        }


def decide(sample: Sample) -> tuple[Outcome | None, str, str]:
    """(outcome, reason, counter) from the counts alone; outcome None: timing decides."""
    first, repeat, other = sample.first, sample.repeat, sample.other
    if first.hit:
        return (
            None,
            f"A's cold send reported {first.hit} cached tokens: the count is not a "
            "cache-hit count here (disaggregated prefill?); timing decides",
            COLD_HITS,
        )
    if other.hit:
        tiers = [f"{tier} {n}" for tier, n in other.tiers if n]
        where = f" (by tier: {', '.join(tiers)})" if tiers else ""
        return (
            Outcome.SHARED,
            f"namespace B reported {other.hit} cached tokens of A's prompt{where}",
            HONEST,
        )
    if repeat.cached is None and not repeat.tiers:
        return None, "the server reports no cached-token count; timing decides", ABSENT
    if not repeat.hit:
        return (
            None,
            "A's repeat reported no cached tokens (caching off, a model that caches "
            "nothing, or a count that lies); timing decides",
            SILENT,
        )
    return Outcome.ISOLATED, "A's repeat hit, B's send did not", HONEST


async def run_round(
    target: Target, settings: CanarySettings, shape: Shape, trigger: str = "schedule"
) -> Result:
    """One round in `shape` (raises the sends' `SendFailed` when one got no answer)."""
    round_id = secrets.token_hex(8)
    a, b = target.identity(shape, round_id, "a0"), target.identity(shape, round_id, "b0")
    text = canary_text(target.markers.mint(), PromptFactory(shape.tokens).fresh().letters)
    first = await target.send(shape, a, text)
    repeat = await target.send(shape, a, text)
    other = await target.send(shape, b, text)
    outcome, reason, counter = decide(Sample(first, repeat, other))
    by = "cached_tokens"
    if outcome is None:
        timed = await timing_round(target, settings, shape, round_id)
        outcome, by, reason = timed.outcome, "timing", f"{reason}: {timed.reason}"
    name, model = target.backend.name, target.model.name
    return Result(
        name,
        model,
        outcome,
        reason,
        by,
        target.sent[0],
        round_id,
        shape.label,
        counter,
        trigger,
        time.time(),
    )
