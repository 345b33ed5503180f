"""The exact tests give the probability of their statistic under the null exactly: checked by
enumerating every interleaving, against scipy where it is installed, and at the floor that
decides how many requests per arm a verdict needs."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from kvfence.probe.stats import TimingTest, auc, critical, floor_p, one_sided_p, p_value, statistic


def enumerated_p(test: TimingTest, hit: list[float], miss: list[float]) -> float:
    """P(stat >= observed) over every way of labelling the pooled values hit or miss."""
    pooled = hit + miss
    observed = statistic(test, hit, miss)
    labellings = list(itertools.combinations(range(len(pooled)), len(hit)))
    extreme = 0
    for chosen in labellings:
        h = [pooled[i] for i in chosen]
        m = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        extreme += statistic(test, h, m) >= observed
    return extreme / len(labellings)


@pytest.mark.parametrize("test", list(TimingTest))
def test_p_values_equal_full_enumeration(test: TimingTest) -> None:
    rng = random.Random(3)
    for _ in range(40):
        m, n = rng.randint(1, 6), rng.randint(1, 6)
        hit = [rng.gauss(0, 1) for _ in range(m)]
        miss = [rng.gauss(0.7, 1) for _ in range(n)]
        assert one_sided_p(test, hit, miss) == pytest.approx(
            enumerated_p(test, hit, miss), abs=1e-12
        )


def test_p_values_match_scipy() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = random.Random(5)
    for _ in range(60):
        m, n = rng.randint(2, 25), rng.randint(2, 25)
        hit = [rng.gauss(0, 1) for _ in range(m)]
        miss = [rng.gauss(0.8, 1) for _ in range(n)]
        mw = scipy_stats.mannwhitneyu(hit, miss, alternative="less", method="exact").pvalue
        ks = scipy_stats.ks_2samp(hit, miss, alternative="greater", method="exact").pvalue
        assert one_sided_p(TimingTest.RANK_SUM, hit, miss) == pytest.approx(mw, rel=1e-9)
        assert one_sided_p(TimingTest.KS, hit, miss) == pytest.approx(ks, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("test", list(TimingTest))
def test_full_separation_reaches_the_published_floor(test: TimingTest) -> None:
    for n in (5, 15, 20):
        hit, miss = [float(i) for i in range(n)], [float(100 + i) for i in range(n)]
        assert one_sided_p(test, hit, miss) == pytest.approx(1 / math.comb(2 * n, n))
    assert floor_p(15, 15) < 1e-8 < floor_p(14, 14)  # 15 per arm is the least that can say shared


@pytest.mark.parametrize("test", list(TimingTest))
def test_ties_never_count_as_faster(test: TimingTest) -> None:
    same = [0.1] * 10
    assert one_sided_p(test, same, same) == 1.0
    assert auc(same, same) == 0.5


def test_overlapping_tails_cost_the_rank_sum_test_less_than_ks() -> None:
    """Why rank-sum is the default: three hits a little slower than the fastest misses."""
    hit = [float(i) for i in range(17)] + [100.5, 101.5, 102.5]
    miss = [float(100 + i) for i in range(20)]
    rank_sum, ks = (one_sided_p(t, hit, miss) for t in (TimingTest.RANK_SUM, TimingTest.KS))
    assert rank_sum < 1e-9 < ks


@pytest.mark.parametrize("test", list(TimingTest))
@pytest.mark.parametrize(("n", "alpha"), [(15, 1e-8), (20, 3.3e-9), (30, 1e-9), (10, 0.01)])
def test_critical_value_is_the_edge_of_rejection(test: TimingTest, n: int, alpha: float) -> None:
    crit = critical(test, n, alpha)
    assert crit is not None
    assert p_value(test, crit, n, n) <= alpha
    step = 1 if test is TimingTest.RANK_SUM else n  # KS moves in steps of n when both arms have n
    assert p_value(test, crit - step, n, n) > alpha


def test_no_critical_value_below_the_floor() -> None:
    assert critical(TimingTest.RANK_SUM, 14, 1e-8) is None
    assert critical(TimingTest.KS, 14, 1e-8) is None
