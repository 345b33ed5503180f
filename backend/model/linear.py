"""Projections x @ w.T of the decoder, with each weight prepared once for its device.

Invariant: a projection returns bit-for-bit what F.linear(x, w) returns for a batch of two or
more rows, and a single row goes through that same batched kernel (a matrix-vector kernel sums
in another order), so a sequence's result never depends on its batch-mates. A prepacked CPU
weight is used only after a probe shows it reproduces F.linear exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The row count the CPU weight layout is tuned for: decode batches are small.
_PACK_ROWS = 2
_PROBE_ROWS = (2, 3, 17)


class Projection:
    """y = x @ weight.T for x: [M, K] in the weight's dtype -> [M, N]."""

    __slots__ = ("_packed", "weight")

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight  # [N, K]
        self._packed = _pack(weight) if _packable(weight) else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            return self._apply(x.expand(2, -1))[:1]
        return self._apply(x)

    def _apply(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is None:
            return F.linear(x, self.weight)
        return _packed_linear(x, self._packed)


def _packable(weight: torch.Tensor) -> bool:
    """oneDNN prepacking: bfloat16 on a CPU with native bfloat16 support only."""
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16 or not torch._C._has_mkldnn:
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch build without the operator
        return False


def _pack(weight: torch.Tensor) -> torch.Tensor | None:
    """The weight in oneDNN's blocked layout, or None when that would change a result.

    The reorder is otherwise done on every call; its product must match F.linear's exactly."""
    packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), _PACK_ROWS)
    gen = torch.Generator().manual_seed(0)
    for rows in _PROBE_ROWS:
        x = torch.randn(rows, weight.shape[1], generator=gen).to(weight.dtype)
        if not torch.equal(_packed_linear(x, packed), F.linear(x, weight)):
            return None
    return packed


def _packed_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    return out
