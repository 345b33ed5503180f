"""The sequential timing test: a fixed schedule of looks (sample sizes per arm) with the
significance level spent across them, so a clear signal stops early and a weak one gets the
whole budget.

Invariant: the alphas of a schedule's looks sum to at most its alpha (Bonferroni), so the chance
of any false "shared" over every look is at most alpha whatever the looks' correlation; a look
whose alpha no outcome can reach is never scheduled.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from kvfence.probe.stats import TimingTest, critical, p_value, statistic

# Sample sizes per arm at which the test may look; the budget is always the last look.
CANDIDATE_LOOKS = (5, 10, 15, 20, 30, 50, 75, 100, 150, 200, 300, 500, 750, 1000)
FIRST_SHARE = 2 / 3  # of alpha, at the first look: a clean signal can stop at the floor
LAST_SHARE = 1 / 6  # at the budget; the looks between share the rest equally


@dataclass(frozen=True, slots=True)
class Look:
    n: int  # per arm
    alpha: float
    critical: int  # the smallest statistic that rejects here


@dataclass(frozen=True, slots=True)
class Schedule:
    test: TimingTest
    alpha: float
    budget: int
    looks: tuple[Look, ...]  # ascending n; empty when no look can reach alpha

    @property
    def min_n(self) -> int | None:
        return self.looks[0].n if self.looks else None

    def look_at(self, n: int) -> Look | None:
        return next((look for look in self.looks if look.n == n), None)


@dataclass(frozen=True, slots=True)
class LookResult:
    n: int
    alpha: float
    p_value: float
    rejected: bool


def plan(test: TimingTest, alpha: float, budget: int) -> Schedule:
    """Looks at the candidate sizes up to `budget` (and at `budget`), starting at the first size
    whose exact floor 1/C(2n, n) is within the first look's share of alpha."""
    if not 0 < alpha < 0.5:
        raise ValueError("alpha must be in (0, 0.5)")
    looks = _plan(test, alpha, budget)
    assert sum(look.alpha for look in looks) <= alpha * (1 + 1e-12)
    return Schedule(test, alpha, budget, looks)


@lru_cache(maxsize=128)
def _plan(test: TimingTest, alpha: float, budget: int) -> tuple[Look, ...]:
    sizes = [n for n in CANDIDATE_LOOKS if n < budget] + [budget]
    first_alpha = alpha * FIRST_SHARE
    sizes = [n for n in sizes if 1 / math.comb(2 * n, n) <= first_alpha]
    if not sizes:
        return ()
    alphas = _spend(alpha, len(sizes))
    looks = []
    for n, a in zip(sizes, alphas, strict=True):
        crit = critical(test, n, a)
        if crit is not None:  # KS at a tiny share may still be unreachable: skip, never fake
            looks.append(Look(n, a, crit))
    return tuple(looks)


def _spend(alpha: float, count: int) -> list[float]:
    if count == 1:
        return [alpha]
    if count == 2:
        return [alpha * FIRST_SHARE, alpha * (1 - FIRST_SHARE)]
    middle = alpha * (1 - FIRST_SHARE - LAST_SHARE) / (count - 2)
    return [alpha * FIRST_SHARE, *([middle] * (count - 2)), alpha * LAST_SHARE]


def evaluate(
    schedule: Schedule, look: Look, hit: Sequence[float], miss: Sequence[float]
) -> LookResult:
    """The test at one look, on the first `look.n` values of each arm (in measurement order)."""
    h, m = hit[: look.n], miss[: look.n]
    if len(h) < look.n or len(m) < look.n:
        raise ValueError(f"look at n={look.n} needs {look.n} values per arm")
    stat = statistic(schedule.test, h, m)
    return LookResult(
        look.n, look.alpha, p_value(schedule.test, stat, look.n, look.n), stat >= look.critical
    )


def run_all(schedule: Schedule, hit: Sequence[float], miss: Sequence[float]) -> list[LookResult]:
    """Every look the samples reach, stopping at the first rejection (as a live run would)."""
    results = []
    for look in schedule.looks:
        if min(len(hit), len(miss)) < look.n:
            break
        results.append(evaluate(schedule, look, hit, miss))
        if results[-1].rejected:
            break
    return results
