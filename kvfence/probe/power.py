"""Power of a sequential schedule against an effect stated as an AUC (the chance that a hit
answers faster than a miss), by seeded simulation of a normal location shift with that AUC.

Invariant: deterministic (a fixed seed and common random numbers across effects), so the same
schedule and effect always give the same power, and power never falls as the effect grows.
"""

from __future__ import annotations

import math
import random
from functools import lru_cache
from statistics import NormalDist

from kvfence.probe.sequential import CANDIDATE_LOOKS, Schedule, plan
from kvfence.probe.stats import TimingTest, statistic

POWER_TARGET = 0.9
REPS = 300
SEED = 20250707


def shift_for(auc: float) -> float:
    """The normal location shift (in standard deviations) whose AUC is `auc`."""
    return math.sqrt(2.0) * NormalDist().inv_cdf(auc)


@lru_cache(maxsize=1024)
def power(schedule: Schedule, auc: float, reps: int = REPS, seed: int = SEED) -> float:
    """The chance that the schedule rejects somewhere when hits beat misses with this AUC."""
    if not schedule.looks:
        return 0.0
    if auc >= 1.0:
        return 1.0  # full separation rejects at the first look by construction of its critical
    shift = shift_for(max(auc, 0.5))
    rng = random.Random(seed)
    budget = schedule.looks[-1].n
    rejected = 0
    for _ in range(reps):
        hit = [rng.gauss(0.0, 1.0) - shift for _ in range(budget)]
        miss = [rng.gauss(0.0, 1.0) for _ in range(budget)]
        rejected += any(
            statistic(schedule.test, hit[: look.n], miss[: look.n]) >= look.critical
            for look in schedule.looks
        )
    return rejected / reps


@lru_cache(maxsize=256)
def detectable_auc(schedule: Schedule, target: float = POWER_TARGET) -> float | None:
    """The smallest AUC (to 0.005) the schedule detects with power >= target; None if none."""
    if not schedule.looks:
        return None
    lo, hi = 0.5, 1.0  # power(lo) < target <= power(hi) = 1
    while hi - lo > 0.005:
        mid = (lo + hi) / 2
        if power(schedule, mid) >= target:
            hi = mid
        else:
            lo = mid
    return round(hi, 3)


@lru_cache(maxsize=256)
def budget_for(
    test: TimingTest, alpha: float, auc: float, target: float = POWER_TARGET
) -> int | None:
    """The smallest candidate budget (per arm) whose schedule reaches `target` power at `auc`."""
    for budget in CANDIDATE_LOOKS:
        schedule = plan(test, alpha, budget)
        if schedule.looks and power(schedule, auc) >= target:
            return budget
    return None
