"""The probe's outcome and its reasons, from the two channels' findings.

Invariant: `shared` needs evidence (a cross-credential metadata hit, or the timing test
rejecting at its spent alpha); `isolated` needs a positive control that passed on at least one
channel and, on every channel whose control passed, no evidence and enough power against the
stated minimum effect; everything else is `inconclusive`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvfence.probe.findings import MetadataFinding, TimingFinding
from kvfence.probe.outcome import Outcome
from kvfence.probe.power import POWER_TARGET, budget_for, detectable_auc, power
from kvfence.probe.sequential import Schedule

EXIT_CODES = {Outcome.ISOLATED: 0, Outcome.SHARED: 1, Outcome.INCONCLUSIVE: 2}
EXIT_ERROR = 3  # the probe could not run: bad credentials, endpoint refused, model not served


@dataclass(frozen=True, slots=True)
class TimingPower:
    min_effect: float  # the share of B's shared-prefix requests that would have to hit
    target_auc: float  # that share of the control's effect, as an AUC
    power: float  # of this run's schedule at target_auc
    detectable_auc: float | None  # the smallest AUC this schedule detects at POWER_TARGET
    budget_needed: int | None  # per arm, for POWER_TARGET at target_auc


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    reasons: tuple[str, ...]
    timing_power: TimingPower | None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]


def timing_power(timing: TimingFinding, schedule: Schedule, min_effect: float) -> TimingPower:
    assert timing.control_auc is not None
    target = 0.5 + min_effect * (timing.control_auc - 0.5)
    achieved = power(schedule, target)
    needed = schedule.budget if achieved >= POWER_TARGET else None
    if needed is None:
        needed = budget_for(schedule.test, schedule.alpha, target)
    return TimingPower(min_effect, round(target, 4), achieved, detectable_auc(schedule), needed)


def decide(
    meta: MetadataFinding, timing: TimingFinding, schedule: Schedule, min_effect: float, rounds: int
) -> Decision:
    """`rounds`: completed cross rounds (the n per arm)."""
    evidence = _evidence(meta, timing)
    if evidence:
        return Decision(Outcome.SHARED, tuple(evidence), None)
    if not (meta.control_passed or timing.control_passed):
        return Decision(Outcome.INCONCLUSIVE, (_control_failed(meta, timing),), None)
    reasons: list[str] = []
    problems: list[str] = []
    if meta.control_passed:
        reasons.append(
            f"metadata: no cross-credential hit in {rounds} shared-prefix requests "
            f"(control: {meta.control_hits} of {meta.control_total} repeats hit)"
        )
        if rounds < min_rounds(min_effect):
            problems.append(
                f"metadata: {rounds} rounds are too few to see a hit on {min_effect:.0%} of "
                f"requests with power {POWER_TARGET} (need {min_rounds(min_effect)})"
            )
    elif meta.available:
        reasons.append(
            f"metadata: only {meta.control_hits} of {meta.control_total} of A's own repeats "
            "reported a hit; counter not used"
        )
    else:
        reasons.append("metadata: the endpoint reports no cached tokens; timing only")
    tp = None
    if timing.control_passed:
        tp = timing_power(timing, schedule, min_effect)
        reasons.append(_timing_clear(timing, tp))
        if tp.power < POWER_TARGET:
            more = f"; about --budget {tp.budget_needed} would do" if tp.budget_needed else ""
            problems.append(
                f"timing: power {tp.power:.2f} < {POWER_TARGET} against AUC {tp.target_auc:.3f} "
                f"with {schedule.budget} per arm{more}"
            )
    else:
        reasons.append(f"timing: A's own repeats were not measurably faster ({_control_p(timing)})")
    if problems:
        return Decision(Outcome.INCONCLUSIVE, tuple(problems + reasons), tp)
    return Decision(Outcome.ISOLATED, tuple(reasons), tp)


def _evidence(meta: MetadataFinding, timing: TimingFinding) -> list[str]:
    out = []
    if meta.shared:
        most = max((*meta.cross_excess, *meta.partial_excess))
        out.append(
            f"metadata: B was served up to {most} cached tokens of A's prompt "
            f"({meta.cross_hits} of {len(meta.cross_excess)} shared-prefix requests, "
            f"{meta.partial_hits} of {len(meta.partial_excess)} partial-prefix requests)"
        )
    if timing.shared:
        look = timing.looks[-1]
        out.append(
            f"timing: B's shared-prefix requests answered faster than its fresh ones "
            f"({timing.test}: p = {look.p_value:.2g} <= {look.alpha:.2g} at n = {look.n} per arm)"
        )
    return out


def _control_p(timing: TimingFinding) -> str:
    if timing.control_p is None:
        return "no control data"
    return f"control p = {timing.control_p:.2g} > {timing.control_alpha:g}"


def _control_failed(meta: MetadataFinding, timing: TimingFinding) -> str:
    if meta.available:
        seen = f"{meta.control_hits} of {meta.control_total} repeats reported a hit"
    else:
        seen = "no cached-token counter"
    return (
        f"positive control failed: credential A's own repeats showed no cache hit ({seen}; "
        f"timing {_control_p(timing)}): caching is off, the prompts are shorter than a cache "
        "block, or entries are evicted at once; nothing can be concluded about isolation"
    )


def _timing_clear(timing: TimingFinding, tp: TimingPower) -> str:
    p = "not tested" if timing.p_value is None else f"p = {timing.p_value:.2g}"
    return (
        f"timing: no significant speed-up for B ({p}); power {tp.power:.2f} to detect sharing "
        f"on {tp.min_effect:.0%} of requests (AUC >= {tp.target_auc:.3f}; "
        f"control AUC {timing.control_auc:.3f})"
    )


def min_rounds(min_effect: float) -> int:
    """Rounds the metadata channel needs to see at least one hit with POWER_TARGET."""
    if min_effect >= 1:
        return 1
    return math.ceil(math.log(1 - POWER_TARGET) / math.log(1 - min_effect))
