"""Which row counts a matrix kernel may be called with so that a row's bits never depend on the
rows beside it, found by probing the host's own kernel (oneDNN picks its blocking, and on some
CPUs its instructions, by the row count: on AMX hosts 1-32 rows and 33+ rows sum differently).

Invariant: a plan admits only row counts at which the probe saw every row keep its bits: tokens
the model generated are run in calls of 2..generated_rows rows (a single row as two, unless the
probe saw each row alone get the bits it gets as two) and get the bits they get alone; prompt
tokens are run in calls of exactly one of `prompt_sizes` rows (zero padded) and get the same bits
at every one of those sizes and positions. A kernel is chosen by shape, dtype, layout and thread
count, never by values, so one probe serves every weight of a shape.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

Kernel = Callable[[torch.Tensor], torch.Tensor]  # x: [M, K] -> [M, N]

# Generated rows: decode batches; more rows than this are split into several calls.
GENERATED_MAX = 32
# Prompt rows: large calls keep the throughput of the kernels tuned for many rows; the smallest
# is above GENERATED_MAX because small calls are where kernels switch their blocking.
PROMPT_CANDIDATES = tuple(range(48, 513, 16))
PROMPT_ENOUGH = 192  # prompt calls this large already run at the kernel's full speed
_SHIFTS = (1, 5, 16, 31)  # prompt rows moved to other positions and other call-mates


@dataclass(frozen=True, slots=True)
class RowPlan:
    generated_rows: int  # generated rows go in calls of 2..generated_rows rows (1: each alone)
    prompt_sizes: tuple[int, ...]  # ascending; empty: prompt rows are run as generated rows
    single_row: bool = False  # a lone generated row runs as one row, not padded to two

    def describe(self) -> str:
        prompt = (
            f"{self.prompt_sizes[0]}..{self.prompt_sizes[-1]}"
            if self.prompt_sizes
            else "as generated rows"
        )
        lone = "" if self.single_row else " (a lone row as two)"
        return f"generated rows <= {self.generated_rows}{lone}, prompt rows {prompt}"


def probe(kernel: Kernel, x: torch.Tensor, prompt: bool) -> RowPlan:
    """x: [P, K] probe rows, P >= max(GENERATED_MAX, PROMPT_CANDIDATES[-1]) (random, any values:
    the kernel is the same for any). `prompt`: also plan prompt rows."""
    solo = torch.cat([run_padded(kernel, x[i : i + 1], 2) for i in range(GENERATED_MAX)])
    generated = 1
    for m in range(2, GENERATED_MAX + 1):
        if not torch.equal(kernel(x[:m]), solo[:m]):
            break
        generated = m
    # A decode at batch 1 pays a copy and a second row on every projection when padded.
    single = all(torch.equal(kernel(x[i : i + 1]), solo[i : i + 1]) for i in range(GENERATED_MAX))
    return RowPlan(generated, _prompt_sizes(kernel, x) if prompt else (), single)


def _prompt_sizes(kernel: Kernel, x: torch.Tensor) -> tuple[int, ...]:
    """The candidate sizes, from the smallest up, at which rows keep the bits of the sizes below."""
    sizes: list[int] = []
    prev: torch.Tensor | None = None
    for m in PROMPT_CANDIDATES:
        y = kernel(x[:m])
        if prev is not None and not torch.equal(y[: prev.shape[0]], prev):
            break
        sizes.append(m)
        prev = y
    if prev is None:
        return ()
    top = sizes[-1]
    for s in _SHIFTS:
        if not torch.equal(kernel(x[:top].roll(s, 0)), prev.roll(s, 0)):
            return ()
    return tuple(sizes)


def better(a: RowPlan, b: RowPlan) -> bool:
    """Whether plan a admits larger calls than plan b (ties: False)."""
    return (a.generated_rows, max(a.prompt_sizes, default=0)) > (
        b.generated_rows,
        max(b.prompt_sizes, default=0),
    )


def sufficient(plan: RowPlan, prompt: bool) -> bool:
    """Whether the plan admits every generated call size and, where prompt rows are planned,
    prompt calls of at least PROMPT_ENOUGH rows: another kernel is not worth probing."""
    return plan.generated_rows == GENERATED_MAX and (
        not prompt or max(plan.prompt_sizes, default=0) >= PROMPT_ENOUGH
    )


def run_padded(kernel: Kernel, x: torch.Tensor, rows: int) -> torch.Tensor:
    """The kernel on x's rows padded to `rows` rows (copies of the last) -> x's rows only."""
    n = x.shape[0]
    if rows == n:
        return kernel(x)
    return kernel(torch.cat((x, x[-1:].expand(rows - n, -1))))[:n]


def run_window(
    kernel: Kernel, x: torch.Tensor, start: int, end: int, size: int, lo: int, hi: int
) -> torch.Tensor:
    """x's rows [start, end) through the kernel in a call of `size` rows: with rows of x next to
    them as call-mates where rows [lo, hi) (the same kind) hold enough, else padded with copies
    of the last (`run_padded`). Either way each row runs in a call of its planned size, at a
    position the probe let vary, so its bits are the same; the window copies nothing."""
    if end - start == size:
        return kernel(x[start:end])
    at = min(start, hi - size)
    if at < lo:
        return run_padded(kernel, x[start:end], size)
    return kernel(x[at : at + size])[start - at : end - at]


@functools.lru_cache(maxsize=4096)
def calls(rows: int, generated: int, plan: RowPlan) -> tuple[tuple[int, int, int], ...]:
    """[start, end) and the padded row count of each kernel call for `rows` rows whose first
    `generated` are generated tokens. Memoized: every projection of a step asks the same."""
    if not plan.prompt_sizes:
        generated = rows
    least = 1 if plan.single_row else 2
    out = [(a, b, max(b - a, least)) for a, b in generated_calls(generated, plan.generated_rows)]
    out += [
        (generated + a, generated + b, size)
        for a, b, size in prompt_calls(rows - generated, plan.prompt_sizes)
    ]
    return tuple(out)


def generated_calls(rows: int, cap: int) -> Iterator[tuple[int, int]]:
    """[start, end) of calls of at most `cap` rows covering `rows`, as even as they can be."""
    calls = -(-rows // max(cap, 1))
    for i in range(calls):
        yield rows * i // calls, rows * (i + 1) // calls


def prompt_calls(rows: int, sizes: tuple[int, ...]) -> Iterator[tuple[int, int, int]]:
    """[start, end) and the padded row count of calls covering `rows` prompt rows."""
    if not rows:
        return
    for start, end in generated_calls(rows, sizes[-1]):
        yield start, end, next(s for s in sizes if s >= end - start)
