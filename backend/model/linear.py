"""Projections x @ w.T of the decoder, with each weight prepared once for its device.

Invariant: a row's result never depends on its batch-mates: every row count (a single row is
run as two) goes through one kernel whose per-row sums do not change with the row count. A CPU
weight prepacked in oneDNN's layout is used only after a probe shows exactly that, and that it
agrees with F.linear (bit-for-bit in bfloat16, where both run the same oneDNN kernel).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The row count the CPU weight layout is tuned for: decode batches are small.
_PACK_ROWS = 2
# Decode batches, odd sizes and prefill chunks: the packed kernel must give each row the same
# bits at every one of these row counts.
_PROBE_ROWS = (2, 3, 17, 64, 345)


class Projection:
    """y = x @ weight.T for x: [M, K] in the weight's dtype -> [M, N]."""

    __slots__ = ("_packed", "weight")

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight  # [N, K]
        self._packed = _pack(weight) if _packable(weight) else None

    @property
    def packed(self) -> bool:
        return self._packed is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            return self._apply(x.expand(2, -1))[:1]
        return self._apply(x)

    def _apply(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is None:
            return F.linear(x, self.weight)
        return _packed_linear(x, self._packed)


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
    """The weight in oneDNN's blocked layout, or None when that would change a result."""
    try:
        packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(
            weight.contiguous(), _PACK_ROWS
        )
    except (AttributeError, RuntimeError):  # a torch build without the operator
        return None
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(max(_PROBE_ROWS), weight.shape[1], generator=gen).to(weight.dtype)
    first = _packed_linear(x[:2], packed)
    for rows in _PROBE_ROWS:
        y = _packed_linear(x[:rows], packed)
        if not torch.equal(y[:2], first) or not _agrees(y, F.linear(x[:rows], weight)):
            return None
    return packed


def _agrees(y: torch.Tensor, reference: torch.Tensor) -> bool:
    if y.dtype == torch.bfloat16:
        return torch.equal(y, reference)
    # Another kernel sums in another order: float32 rounding apart, nothing more.
    return torch.allclose(y, reference, rtol=1e-4, atol=1e-4)


def _packed_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    return out
