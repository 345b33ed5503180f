"""A canary round's timing mode, for a server whose cached-token count cannot decide: the
probe's own procedure (kvfence.probe.method) in the round's shape: warm-up, a positive control
(A's repeats against A's fresh prompts), then paired cross procedures in random order (A
primes a prompt, B sends it; A primes, B sends a fresh one) with the sequential rank-sum test.

Invariant: under isolation B's two arms are exchangeable (same shape, same priming, random
order), so the exact test says `shared` with probability at most `timing_alpha` per round,
whatever the server's jitter or load; the watch quarantines on a timing-only `shared` only
when one of (at most) two further rounds confirms it, so a healthy server is quarantined with
probability at most 2 `timing_alpha`^2 per round. `isolated` needs a passing control and the
power the probe requires.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from gateway.policy.backend_model import CanarySettings
from gateway.verify.shapes import Shape
from gateway.verify.target import Target, canary_text
from kvfence.probe.client import Identity, Observation
from kvfence.probe.method import ProbeConfig, run_probe
from kvfence.probe.outcome import Outcome

CONTROL_ROUNDS: Final = 8  # control procedures per arm: enough for a clear cache at 1e-3
CONTROL_ALPHA: Final = 1e-3
MIN_EFFECT: Final = 0.9  # "isolated" must have the power to see 90% of B's requests hit


@dataclass(frozen=True, slots=True)
class Timed:
    outcome: Outcome
    reason: str
    requests: int


def config(settings: CanarySettings, shape: Shape) -> ProbeConfig:
    return ProbeConfig(
        letters=shape.tokens,
        partial_rounds=0,
        control_rounds=CONTROL_ROUNDS,
        budget=settings.timing_budget,
        alpha=settings.timing_alpha,
        control_alpha=CONTROL_ALPHA,
        min_effect=MIN_EFFECT,
        use_metadata=False,
    )


def most_requests(settings: CanarySettings) -> int:
    """The most requests one timing round sends: warm-up, control, and every cross round."""
    return 4 + CONTROL_ROUNDS * 4 + settings.timing_budget * 4


async def timing_round(
    target: Target, settings: CanarySettings, shape: Shape, round_id: str
) -> Timed:
    """Raises the sends' `SendFailed` when one got no answer (the round is inconclusive)."""
    a, b = target.identity(shape, round_id, "ta"), target.identity(shape, round_id, "tb")
    live: dict[str, str] = {}

    async def sender(who: Identity, text: str) -> Observation:
        # The probe's prompts open with their own random id; each id gets one live marker,
        # so A's prompt and B's copy of it carry the same one.
        head, _, letters = text.partition(" ")
        marker = live.get(head) or live.setdefault(head, target.markers.mint())
        sent = await target.send(shape, who, canary_text(marker, letters.split(" ")))
        return Observation(sent.ttft_s, sent.cached, sent.prompt, 1)

    result = await run_probe(sender, a, b, config(settings, shape))
    decision = result.decision
    reasons = [r for r in decision.reasons if not r.startswith("metadata:")]  # counts unused
    return Timed(decision.outcome, "; ".join(reasons), result.requests)
