"""The sequential timing test: alpha is spent across the looks so the chance of a false
`shared` stays at most alpha (checked by simulation), a clear signal stops at the first look,
and the power calculation behind `isolated` behaves."""

from __future__ import annotations

import random

import pytest

from kvfence.probe.power import budget_for, detectable_auc, power
from kvfence.probe.sequential import Look, Schedule, plan, run_all
from kvfence.probe.stats import TimingTest, critical


def test_schedule_spends_at_most_alpha_and_ends_at_the_budget() -> None:
    for budget in (15, 16, 20, 50, 100):
        schedule = plan(TimingTest.RANK_SUM, 1e-8, budget)
        assert sum(look.alpha for look in schedule.looks) <= 1e-8 * (1 + 1e-12)
        assert schedule.looks[0].n == 15  # the first size whose floor is within reach
        assert schedule.looks[-1].n == budget


def test_no_look_when_the_budget_cannot_reach_alpha() -> None:
    assert plan(TimingTest.RANK_SUM, 1e-8, 14).looks == ()
    assert plan(TimingTest.KS, 1e-8, 10).min_n is None


def null_rejection_rate(schedule: Schedule, runs: int, seed: int) -> float:
    """Both arms from one distribution (with a heavy tail, as server times have)."""
    rng = random.Random(seed)
    budget = schedule.looks[-1].n
    rejected = 0
    for _ in range(runs):
        hit = [rng.lognormvariate(0, 0.6) for _ in range(budget)]
        miss = [rng.lognormvariate(0, 0.6) for _ in range(budget)]
        rejected += any(r.rejected for r in run_all(schedule, hit, miss))
    return rejected / runs


@pytest.mark.parametrize("test", list(TimingTest))
def test_false_shared_rate_stays_within_alpha(test: TimingTest) -> None:
    schedule = plan(test, 0.05, 50)  # looks at 5, 10, 15, 20, 30, 50
    assert len(schedule.looks) == 6
    assert null_rejection_rate(schedule, 2000, seed=11) <= 0.05


def test_looking_repeatedly_at_full_alpha_would_exceed_it() -> None:
    """The check above can fail: the same looks without spending alpha reject too often."""
    spent = plan(TimingTest.RANK_SUM, 0.05, 50)
    unspent = Schedule(
        TimingTest.RANK_SUM,
        0.05,
        50,
        tuple(
            Look(look.n, 0.05, critical(TimingTest.RANK_SUM, look.n, 0.05) or 0)
            for look in spent.looks
        ),
    )
    assert null_rejection_rate(unspent, 2000, seed=11) > 0.06


def test_a_clear_signal_stops_at_the_first_look() -> None:
    schedule = plan(TimingTest.RANK_SUM, 1e-8, 100)
    rng = random.Random(2)
    stops = []
    for _ in range(50):
        hit = [0.15 + rng.expovariate(50) for _ in range(100)]  # ~0.15 s against ~0.48 s
        miss = [0.48 + rng.expovariate(50) for _ in range(100)]
        results = run_all(schedule, hit, miss)
        assert results[-1].rejected
        stops.append(results[-1].n)
    assert set(stops) == {15}


def test_a_weak_signal_gets_the_whole_budget() -> None:
    schedule = plan(TimingTest.RANK_SUM, 1e-8, 100)
    rng = random.Random(4)
    hit = [rng.gauss(0.0, 1.0) for _ in range(100)]
    miss = [rng.gauss(0.5, 1.0) for _ in range(100)]  # AUC about 0.64: too weak to stop early
    results = run_all(schedule, hit, miss)
    assert [r.n for r in results] == [look.n for look in schedule.looks]


def test_power_grows_with_the_effect_and_the_budget() -> None:
    small, large = plan(TimingTest.RANK_SUM, 1e-8, 20), plan(TimingTest.RANK_SUM, 1e-8, 50)
    assert power(small, 0.9) < power(small, 0.99) <= power(small, 1.0) == 1.0
    assert power(small, 0.9) < power(large, 0.9)
    assert power(plan(TimingTest.RANK_SUM, 1e-8, 14), 1.0) == 0.0


def test_detectable_effect_and_the_budget_it_needs_agree() -> None:
    mde = detectable_auc(plan(TimingTest.RANK_SUM, 1e-8, 50))
    assert mde is not None and 0.8 < mde < 0.95
    assert budget_for(TimingTest.RANK_SUM, 1e-8, mde) == 50
    # the rank-sum test needs fewer requests than KS for the same effect
    ks, rank_sum = (
        budget_for(TimingTest.KS, 1e-8, 0.95),
        budget_for(TimingTest.RANK_SUM, 1e-8, 0.95),
    )
    assert rank_sum is not None and ks is not None and rank_sum < ks
