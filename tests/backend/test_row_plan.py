"""Row plans: the call sizes a matrix kernel is fed are the ones its probe saw keep every row's
bits, for kernels that behave like those of several kinds of CPU."""

from __future__ import annotations

import itertools

import pytest
import torch

from backend.model.row_plan import (
    GENERATED_MAX,
    PROMPT_CANDIDATES,
    Kernel,
    RowPlan,
    better,
    calls,
    generated_calls,
    probe,
    prompt_calls,
    run_window,
    sufficient,
)

GEN = torch.Generator().manual_seed(3)
W = torch.randn(24, 40, generator=GEN, dtype=torch.float64)
X = torch.randn(PROMPT_CANDIDATES[-1], 40, generator=GEN, dtype=torch.float64)


def steady(x: torch.Tensor) -> torch.Tensor:
    """One summation order for every call (AVX-512 without AMX, as seen): [M, K] -> [M, N]."""
    return (x.unsqueeze(1) * W).sum(-1)


def switching_at(rows: int) -> Kernel:
    """Another summation order from `rows` rows on (AMX: 33 rows; some shapes again later)."""
    return lambda x: steady(x) + (1e-12 if x.shape[0] >= rows else 0.0)


def by_position(x: torch.Tensor) -> torch.Tensor:
    """Rows summed differently by where they sit in the call."""
    return steady(x) + torch.arange(x.shape[0], dtype=x.dtype).unsqueeze(1) * 1e-12


def test_a_steady_kernel_takes_every_call_size() -> None:
    plan = probe(steady, X, prompt=True)
    assert plan == RowPlan(GENERATED_MAX, PROMPT_CANDIDATES, single_row=True)
    assert sufficient(plan, prompt=True)


def test_a_kernel_that_switches_past_32_rows_keeps_the_two_kinds_apart() -> None:
    plan = probe(switching_at(33), X, prompt=True)
    assert plan == RowPlan(32, PROMPT_CANDIDATES, single_row=True)  # prompts sum the second way


def test_a_kernel_that_sums_one_row_its_own_way_runs_a_lone_row_as_two() -> None:
    """A GEMV path for one row (oneDNN on some hosts): a lone decode is padded to two rows."""
    plan = probe(lambda x: steady(x) + (1e-12 if x.shape[0] == 1 else 0.0), X, prompt=True)
    assert plan == RowPlan(GENERATED_MAX, PROMPT_CANDIDATES, single_row=False)
    assert calls(1, 1, plan) == ((0, 1, 2),)


@pytest.mark.parametrize(("rows", "generated", "largest"), [(9, 8, 512), (150, 32, 144)])
def test_switches_bound_the_calls(rows: int, generated: int, largest: int) -> None:
    plan = probe(switching_at(rows), X, prompt=True)
    assert plan.generated_rows == generated
    assert plan.prompt_sizes[-1] == largest


def test_a_kernel_that_depends_on_position_gets_rows_alone() -> None:
    plan = probe(by_position, X, prompt=True)
    assert plan == RowPlan(1, (), single_row=True)  # its first row is the same alone
    assert not sufficient(plan, prompt=True)


def test_without_prompt_rows_only_generated_calls_are_planned() -> None:
    plan = probe(steady, X, prompt=False)
    assert plan == RowPlan(GENERATED_MAX, (), single_row=True)
    assert sufficient(plan, prompt=False)


def test_better_prefers_larger_calls() -> None:
    assert better(RowPlan(32, (48, 64)), RowPlan(32, (48,)))
    assert better(RowPlan(32, ()), RowPlan(8, PROMPT_CANDIDATES))
    assert not better(RowPlan(32, (48,)), RowPlan(32, (48,)))


@pytest.mark.parametrize("rows", [1, 2, 31, 32, 33, 64, 65, 300])
@pytest.mark.parametrize("cap", [1, 2, 7, 32])
def test_generated_calls_cover_the_rows_within_the_cap(rows: int, cap: int) -> None:
    calls = list(generated_calls(rows, cap))
    assert [a for a, _ in calls] == [0, *(b for _, b in calls[:-1])]
    assert calls[-1][1] == rows
    assert all(1 <= b - a <= cap for a, b in calls)
    assert rows == 1 or cap <= 2 or all(b - a >= 2 for a, b in calls)  # no lone row (run as 2)


@pytest.mark.parametrize("rows", [1, 47, 48, 49, 256, 257, 308, 1000])
def test_prompt_calls_are_padded_to_a_probed_size(rows: int) -> None:
    sizes = (48, 64, 128)
    calls = list(prompt_calls(rows, sizes))
    assert calls[0][0] == 0 and calls[-1][1] == rows
    assert all(size in sizes and b - a <= size for a, b, size in calls)
    assert all(b == a2 for (_, b, _), (a2, _, _) in itertools.pairwise(calls))


def test_calls_keep_generated_and_prompt_rows_apart() -> None:
    plan = RowPlan(32, (48, 64))
    assert calls(40, 40, plan) == ((0, 20, 20), (20, 40, 20))
    assert calls(45, 5, plan) == ((0, 5, 5), (5, 45, 48))
    assert calls(1, 1, plan) == ((0, 1, 2),)  # one row runs as two
    assert calls(1, 1, RowPlan(32, (48, 64), single_row=True)) == ((0, 1, 1),)
    assert calls(70, 0, plan) == ((0, 35, 48), (35, 70, 48))
    # Without prompt sizes every row runs as a generated one.
    assert calls(45, 5, RowPlan(32, ())) == ((0, 22, 22), (22, 45, 23))


class Recording:
    """`steady`, keeping each call's rows (the tensor it was handed)."""

    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x)
        return steady(x)


def test_a_call_padded_with_rows_of_its_own_kind_copies_nothing_and_answers_alike() -> None:
    x = X[:300]
    kernel = Recording()
    out = run_window(kernel, x, 150, 300, 160, lo=100, hi=300)  # rows 140..299, one call
    assert torch.equal(out, steady(x)[150:300])
    assert kernel.seen[0].shape[0] == 160
    assert kernel.seen[0].data_ptr() == x[140].data_ptr()  # a view of x's own rows, no copy
    out = run_window(kernel, x, 100, 250, 160, lo=100, hi=300)  # rows 100..259
    assert torch.equal(out, steady(x)[100:250])
    assert kernel.seen[1].data_ptr() == x[100].data_ptr()


def test_a_call_without_enough_rows_of_its_kind_is_padded_with_copies() -> None:
    x = X[:300]
    kernel = Recording()
    # Rows 150..299 in a call of 160, but rows below 200 are the other kind: copies pad it.
    out = run_window(kernel, x, 200, 300, 160, lo=200, hi=300)
    assert torch.equal(out, steady(x)[200:300])
    assert torch.equal(kernel.seen[0][100:], x[299:].expand(60, -1))
    # Fewer rows than the call in all: padded, as a lone prompt chunk of 30 rows in a call of 48.
    assert torch.equal(run_window(kernel, x[:30], 0, 30, 48, lo=0, hi=30), steady(x[:30]))
    assert kernel.seen[1].shape[0] == 48
