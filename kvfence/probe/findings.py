"""What the measurements show, per channel: the cached-token counter (metadata) and the time to
the first token (timing), each with its positive control. Pure functions of the measurements.

Invariant: a metadata hit is counted only as cached tokens *beyond* the attacker's own baseline
(the most it ever saw cached on a fresh prompt: a chat template's shared system prompt), so
public template blocks never count as sharing, and a fresh random prompt cannot exceed it by a
block unless another credential's blocks were used.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from kvfence.probe.rounds import Arm, Measurement, Phase, times
from kvfence.probe.sequential import LookResult, Schedule, run_all
from kvfence.probe.stats import TimingTest, auc, one_sided_p


@dataclass(frozen=True, slots=True)
class MetadataFinding:
    available: bool  # the endpoint reported cached tokens and the probe read them
    block_tokens: int  # the excess that counts as a hit
    control_hits: int  # control hit-arm requests with a hit (A's own repeat)
    control_total: int
    cross_excess: tuple[int, ...]  # each cross hit-arm request's excess over B's baseline
    partial_excess: tuple[int, ...]

    @property
    def control_passed(self) -> bool:
        return (
            self.available
            and self.control_total > 0
            and 2 * self.control_hits >= self.control_total
        )

    @property
    def cross_hits(self) -> int:
        return sum(e >= self.block_tokens for e in self.cross_excess)

    @property
    def partial_hits(self) -> int:
        return sum(e >= self.block_tokens for e in self.partial_excess)

    @property
    def shared(self) -> bool:
        return self.available and (self.cross_hits + self.partial_hits) > 0


def _excess(measurements: Sequence[Measurement], phase: Phase, arm: Arm) -> tuple[int, ...]:
    """Each `arm` request's cached tokens beyond the attacker's baseline at that moment."""
    out: list[int] = []
    base: dict[str, int] = {}
    for m in measurements:
        cached = m.cached_tokens or 0
        if m.arm is Arm.MISS:  # warm-up requests are fresh prompts too
            base[m.attacker] = max(base.get(m.attacker, 0), cached)
        elif m.phase is phase and m.arm is arm:
            out.append(cached - base.get(m.attacker, 0))
    return tuple(out)


def metadata_finding(
    measurements: Sequence[Measurement], block_tokens: int, use: bool = True
) -> MetadataFinding:
    available = use and any(m.cached_tokens is not None for m in measurements)
    control = _excess(measurements, Phase.CONTROL, Arm.HIT) if available else ()
    return MetadataFinding(
        available,
        block_tokens,
        sum(e >= block_tokens for e in control),
        len(control),
        _excess(measurements, Phase.CROSS, Arm.HIT) if available else (),
        _excess(measurements, Phase.CROSS, Arm.PARTIAL) if available else (),
    )


@dataclass(frozen=True, slots=True)
class ArmTimes:
    n: int
    median_s: float | None


def arm_times(values: Sequence[float]) -> ArmTimes:
    return ArmTimes(len(values), statistics.median(values) if values else None)


@dataclass(frozen=True, slots=True)
class TimingFinding:
    test: TimingTest
    control_alpha: float
    control_p: float | None  # A's own hit vs miss; None without control data
    control_auc: float | None
    control_hit: ArmTimes
    control_miss: ArmTimes
    looks: tuple[LookResult, ...]  # the cross looks reached, up to the first rejection
    cross_auc: float | None
    cross_hit: ArmTimes
    cross_miss: ArmTimes
    partial: ArmTimes

    @property
    def control_passed(self) -> bool:
        return self.control_p is not None and self.control_p <= self.control_alpha

    @property
    def shared(self) -> bool:
        return any(look.rejected for look in self.looks)

    @property
    def p_value(self) -> float | None:
        return self.looks[-1].p_value if self.looks else None


def timing_finding(
    measurements: Sequence[Measurement], schedule: Schedule, control_alpha: float
) -> TimingFinding:
    c_hit, c_miss = (
        times(measurements, Phase.CONTROL, Arm.HIT),
        times(measurements, Phase.CONTROL, Arm.MISS),
    )
    x_hit, x_miss = (
        times(measurements, Phase.CROSS, Arm.HIT),
        times(measurements, Phase.CROSS, Arm.MISS),
    )
    has_control = bool(c_hit and c_miss)
    return TimingFinding(
        schedule.test,
        control_alpha,
        # The control always uses the rank-sum test: with 12 rounds at 1e-4 KS tolerates one
        # hit out of place, rank-sum 11 pairs; noise must not make a working cache look absent.
        one_sided_p(TimingTest.RANK_SUM, c_hit, c_miss) if has_control else None,
        auc(c_hit, c_miss) if has_control else None,
        arm_times(c_hit),
        arm_times(c_miss),
        tuple(run_all(schedule, x_hit, x_miss)),
        auc(x_hit, x_miss) if x_hit and x_miss else None,
        arm_times(x_hit),
        arm_times(x_miss),
        arm_times(times(measurements, Phase.CROSS, Arm.PARTIAL)),
    )
