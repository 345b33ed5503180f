"""Projections x @ w.T of the decoder, with each weight prepared once for its device.

Invariant: a row's result never depends on its batch-mates: rows are fed to the kernel only in
calls whose row counts a probe of this host's kernel admitted (backend.model.row_plan), so a
generated token gets the bits it gets alone and a prompt token the bits it gets in any prompt
chunk. A CPU weight prepacked in oneDNN's layout is used only where it agrees with F.linear
(bit-for-bit in bfloat16, where both run the same oneDNN kernel) and its plan is at least as good.
Generated rows go to our own kernel (backend.model.native) where it is built and its probe saw
every row keep its bits alone and in calls of any size; prompt rows stay with oneDNN.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from backend.model import native
from backend.model.row_plan import (
    GENERATED_MAX,
    PROMPT_CANDIDATES,
    Kernel,
    RowPlan,
    better,
    calls,
    probe,
    run_window,
    sufficient,
)

# The row count the CPU weight layout is tuned for: decode batches are small.
_PACK_ROWS = 2


@dataclass(frozen=True, slots=True)
class _Choice:
    packed: bool
    plan: RowPlan
    native: bool = False  # generated rows (every row, where prompt rows are not planned) go to it


class RowPlanner:
    """Probes each (shape, dtype, device, thread count, prompt use) once and remembers the plan;
    the thread count is the one in force when the weights are prepared (set it before loading)."""

    def __init__(self) -> None:
        self._choices: dict[tuple[object, ...], _Choice] = {}

    def choose(
        self, weight: torch.Tensor, prompt: bool
    ) -> tuple[torch.Tensor | None, RowPlan, bool]:
        """The weight prepacked (or None: F.linear), its row plan, and whether generated rows
        go to our own kernel."""
        key = (tuple(weight.shape), weight.dtype, weight.device, torch.get_num_threads(), prompt)
        known = self._choices.get(key)
        if known is None:
            known = self._choices[key] = _probe(weight, prompt)
        return (_pack(weight) if known.packed else None), known.plan, known.native


def _probe(weight: torch.Tensor, prompt: bool) -> _Choice:
    packed = _pack(weight) if _packable(weight) else None
    if packed is not None and not _agrees(weight, packed, _probe_rows(weight)):
        packed = None
    # The plan is probed on a weight of the same shape and rows that cancel against it: every
    # output is a rounding residue, so another summation order shows in nearly every output.
    w, x = _cancelling(weight)
    choice = _Choice(False, RowPlan(0, (), False))
    if packed is not None and (packed_w := _pack(w)) is not None:
        choice = _Choice(True, probe(_packed_kernel(packed_w), x, prompt))
    if not sufficient(choice.plan, prompt):
        plain = probe(_plain_kernel(w), x, prompt)
        if better(plain, choice.plan):
            choice = _Choice(False, plain)
    return _with_native(choice, w, x, prompt)


def _with_native(choice: _Choice, w: torch.Tensor, x: torch.Tensor, prompt: bool) -> _Choice:
    """Generated rows to our own kernel, where it is built and its probe saw every row keep its
    bits at every call size, alone included. Prompt rows stay with oneDNN, so a weight whose
    prompt rows could not be planned (they would run as generated rows) keeps oneDNN whole."""
    kernel = native.gemv_kernel(w)
    if kernel is None or (prompt and not choice.plan.prompt_sizes):
        return choice
    own = probe(kernel, x, prompt=False)
    if own.generated_rows < GENERATED_MAX or not own.single_row:
        return choice
    plan = RowPlan(GENERATED_MAX, choice.plan.prompt_sizes, single_row=True)
    return _Choice(choice.packed, plan, native=True)


class Projection:
    """y = x @ weight.T for x: [M, K] in the weight's dtype -> [M, N]."""

    __slots__ = ("_generated", "_kernel", "_packed", "plan", "weight")

    def __init__(
        self, weight: torch.Tensor, planner: RowPlanner | None = None, prompt: bool = True
    ) -> None:
        """`prompt`: whether prompt rows are ever projected (the logits head sees only the rows
        it samples, all run as generated rows)."""
        self.weight = weight  # [N, K]
        self._packed, self.plan, own = (planner or RowPlanner()).choose(weight, prompt)
        packed = self._packed
        self._kernel = _plain_kernel(weight) if packed is None else _packed_kernel(packed)
        self._generated = (own and native.gemv_kernel(weight)) or self._kernel

    @property
    def native(self) -> bool:
        """Whether generated rows go to our own kernel (backend.model.native)."""
        return self._generated is not self._kernel

    @property
    def packed(self) -> bool:
        return self._packed is not None

    def weight_bytes(self) -> int:
        """Bytes of the weight a call reads."""
        return self.weight.numel() * self.weight.element_size()

    def __call__(self, x: torch.Tensor, generated: int) -> torch.Tensor:
        """x's first `generated` rows are tokens the model generated, the rest prompt tokens."""
        n = x.shape[0]
        parts = calls(n, generated, self.plan)
        # As `calls` has it: where prompt rows are not planned, every row runs as generated.
        ours = generated if self.plan.prompt_sizes else n
        if len(parts) == 1:  # most steps: decodes alone, or one prompt chunk alone
            return self._call(x, *parts[0], ours)
        out = x.new_empty(n, self.weight.shape[0])
        for start, end, size in parts:
            out[start:end] = self._call(x, start, end, size, ours)
        return out

    def _call(self, x: torch.Tensor, start: int, end: int, size: int, ours: int) -> torch.Tensor:
        """Rows [start, end) in one call of `size` rows, padded with rows of their own kind
        (generated rows below `ours`, prompt rows from it) where x has enough."""
        if start < ours:
            return run_window(self._generated, x, start, end, size, 0, ours)
        return run_window(self._kernel, x, start, end, size, ours, x.shape[0])


def _probe_rows(weight: torch.Tensor) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(GENERATED_MAX, weight.shape[1], generator=gen)
    return x.to(device=weight.device, dtype=weight.dtype)


def _cancelling(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight like `weight` and probe rows whose products cancel exactly: column half + j of
    the weight repeats column order[j], and the rows hold minus the same value there."""
    gen = torch.Generator().manual_seed(0)
    (n, k), half = weight.shape, weight.shape[1] // 2
    rows = max(GENERATED_MAX, PROMPT_CANDIDATES[-1])
    a = torch.randn(n, half, generator=gen).to(weight.dtype)
    b = torch.randn(rows, half, generator=gen).to(weight.dtype)
    order = torch.randperm(half, generator=gen)
    w = torch.zeros(n, k, dtype=weight.dtype)
    x = torch.zeros(rows, k, dtype=weight.dtype)
    w[:, :half], w[:, half : 2 * half] = a, a[:, order]
    x[:, :half], x[:, half : 2 * half] = b, -b[:, order]
    return w.to(weight.device), x.to(weight.device)


def _packable(weight: torch.Tensor) -> bool:
    """oneDNN prepacking: float32 on any CPU, bfloat16 only where oneDNN runs it natively.

    float32 gains most: F.linear sends it to MKL, which repacks the weight on every call (at
    decode sizes that doubles the memory traffic of a memory-bound product)."""
    if weight.device.type != "cpu" or not torch._C._has_mkldnn:
        return False
    if weight.dtype == torch.float32:
        return True
    if weight.dtype != torch.bfloat16:
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch build without the operator
        return False


def _pack(weight: torch.Tensor) -> torch.Tensor | None:
    """The weight in oneDNN's blocked layout, or None where torch lacks the operator."""
    try:
        packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(
            weight.contiguous(), _PACK_ROWS
        )
    except (AttributeError, RuntimeError):  # a torch build without the operator
        return None
    return packed


def _agrees(weight: torch.Tensor, packed: torch.Tensor, x: torch.Tensor) -> bool:
    y = _packed_kernel(packed)(x)
    reference = F.linear(x, weight)
    if y.dtype == torch.bfloat16:
        return torch.equal(y, reference)
    # Another kernel sums in another order: float32 rounding apart, nothing more.
    return torch.allclose(y, reference, rtol=1e-4, atol=1e-4)


def _plain_kernel(weight: torch.Tensor) -> Kernel:
    return lambda x: F.linear(x, weight)


def _packed_kernel(packed: torch.Tensor) -> Kernel:
    def run(x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        return out

    return run
