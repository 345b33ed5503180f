"""Exact one-sided two-sample tests that say "hits are faster than misses": the Wilcoxon-Mann-
Whitney rank-sum test (the probe's default) and the Kolmogorov-Smirnov test Gu et al. published.

Invariant: pure integer arithmetic over the exact null distribution (every interleaving of the
two samples equally likely), so a p-value is exact down to 1/C(m+n, m) with no scipy; ties
always count against "hits are faster", which keeps both tests conservative.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from enum import StrEnum
from fractions import Fraction


class TimingTest(StrEnum):
    RANK_SUM = "rank-sum"  # one-sided Wilcoxon-Mann-Whitney: U = #(hit < miss)
    KS = "ks"  # one-sided Kolmogorov-Smirnov: D+ = max(F_hit - F_miss)


def floor_p(m: int, n: int) -> float:
    """The smallest p-value either test can give with m hits and n misses: 1/C(m+n, m)."""
    return 1.0 / math.comb(m + n, m)


def auc(hit: Sequence[float], miss: Sequence[float]) -> float:
    """P(a hit answers faster than a miss), ties half: 0.5 is no effect, 1.0 full separation."""
    ordered = sorted(miss)
    wins = 0.0
    for h in hit:
        lo, hi = bisect.bisect_left(ordered, h), bisect.bisect_right(ordered, h)
        wins += len(ordered) - hi + 0.5 * (hi - lo)
    return wins / (len(hit) * len(miss))


def statistic(test: TimingTest, hit: Sequence[float], miss: Sequence[float]) -> int:
    """The integer statistic: U for the rank-sum test, max(i*n - j*m) (= m*n*D+) for KS."""
    if not hit or not miss:
        raise ValueError("both samples need at least one value")
    if test is TimingTest.RANK_SUM:
        ordered = sorted(miss)
        return sum(len(ordered) - bisect.bisect_right(ordered, h) for h in hit)
    return _ks_lattice_max(hit, miss)


def p_value(test: TimingTest, stat: int, m: int, n: int) -> float:
    """P(statistic >= stat) under the null for m hits and n misses, exactly."""
    total = math.comb(m + n, m)
    if test is TimingTest.RANK_SUM:
        return float(Fraction(_rank_sum_tail(stat, m, n), total))
    return float(Fraction(total - _ks_paths_below(stat, m, n), total))


def one_sided_p(test: TimingTest, hit: Sequence[float], miss: Sequence[float]) -> float:
    return p_value(test, statistic(test, hit, miss), len(hit), len(miss))


def critical(test: TimingTest, n: int, alpha: float) -> int | None:
    """The smallest statistic that rejects at `alpha` with n per arm, or None if none can."""
    total = math.comb(2 * n, n)
    allowed = math.floor(alpha * total)  # arrangements as extreme or more that alpha allows
    if allowed < 1:
        return None
    if test is TimingTest.KS:
        # m = n: P(D+ >= k/n) = C(2n, n-k) / C(2n, n)   (Gnedenko-Korolyuk)
        for k in range(1, n + 1):
            if math.comb(2 * n, n - k) <= allowed:
                return k * n
        return None
    degree = 64
    while True:  # the lowest degree whose cumulative count passes `allowed`
        counts = _rank_sum_lower(n, n, degree)
        if sum(counts) > allowed or degree >= n * n // 2:
            break
        degree *= 2
    cumulative, d = 0, -1
    for count in counts:
        if cumulative + count > allowed:
            break
        cumulative += count
        d += 1
    return n * n - d if d >= 0 else None


_lower_cache: dict[tuple[int, int], tuple[int, ...]] = {}


def _rank_sum_lower(m: int, n: int, degree: int) -> tuple[int, ...]:
    """How many interleavings give U = 0, 1, ..., degree: the low coefficients of the Gaussian
    binomial [m+n choose m]_q = prod_{i=1..m} (1 - q^(n+i)) / (1 - q^i). Cached per (m, n),
    computed again only to a higher degree (at least doubling)."""
    degree = min(degree, m * n)
    known = _lower_cache.get((m, n), ())
    if len(known) > degree:
        return known[: degree + 1]
    top = min(m * n, max(degree, 2 * len(known)))
    c = [0] * (top + 1)
    c[0] = 1
    for i in range(1, m + 1):
        k = n + i
        for d in range(top, k - 1, -1):
            c[d] -= c[d - k]
        for d in range(i, top + 1):
            c[d] += c[d - i]
    if len(_lower_cache) > 64:
        _lower_cache.clear()
    _lower_cache[(m, n)] = tuple(c)
    return _lower_cache[(m, n)][: degree + 1]


def _rank_sum_tail(u: int, m: int, n: int) -> int:
    """Interleavings with U >= u (U is symmetric about mn/2, so only a lower half is summed)."""
    if u <= 0:
        return math.comb(m + n, m)
    if u > m * n:
        return 0
    low = m * n - u  # P(U >= u) = P(U <= mn - u)
    if low <= u - 1:
        return sum(_rank_sum_lower(m, n, low))
    return math.comb(m + n, m) - sum(_rank_sum_lower(m, n, u - 1))


def _ks_lattice_max(hit: Sequence[float], miss: Sequence[float]) -> int:
    """max over thresholds x of i*n - j*m, i hits and j misses <= x (at least 0)."""
    m, n = len(hit), len(miss)
    hs, ms = sorted(hit), sorted(miss)
    best = 0
    for x in hs:  # the maximum is reached just after a hit; ties count every miss at x
        i = bisect.bisect_right(hs, x)
        j = bisect.bisect_right(ms, x)
        best = max(best, i * n - j * m)
    return best


def _ks_paths_below(h: int, m: int, n: int) -> int:
    """Monotone lattice paths from (0,0) to (m,n) on which i*n - j*m < h at every point."""
    if h <= 0:
        return 0
    row = [1] * (n + 1)  # row[j]: paths to (i, j); for i = 0, i*n - j*m <= 0 < h always
    for i in range(1, m + 1):
        new = [0] * (n + 1)
        for j in range(n + 1):
            if i * n - j * m >= h:
                continue
            new[j] = row[j] + (new[j - 1] if j else 0)
        row = new
    return row[n]
