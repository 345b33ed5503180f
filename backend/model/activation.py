"""SwiGLU, silu(gate) * up, with each row's bits independent of how many rows share the call.

Invariant: ATen splits an elementwise op across threads by element count, and the elements at a
split may take a scalar path that rounds differently from the vector one (float32 silu: about 4%
of inputs differ). Where silu rounds every value of the dtype alike on both paths (checked on
all 65,536 bfloat16 values) any call size is safe; elsewhere rows are fed in calls of at most
`rows` rows, a count up to which a probe saw every row keep the bits it has alone (a call of one
row is always split the same way).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_MAX_ROWS = 64
_SERIAL = 4096  # elements per call when checking the vector path: below ATen's parallel grain


class SwiGLU:
    def __init__(self, ffn: int, dtype: torch.dtype, device: torch.device) -> None:
        self.any_rows = _paths_agree(dtype, device)
        self.rows = _MAX_ROWS if self.any_rows else _probe_rows(ffn, dtype, device)

    def describe(self) -> str:
        return "swiglu rows: any" if self.any_rows else f"swiglu rows <= {self.rows}"

    def __call__(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up: [T, 2F] (gate, then up) -> [T, F]."""
        if self.any_rows or gate_up.shape[0] <= self.rows:
            return _swiglu(gate_up)
        rows = range(0, gate_up.shape[0], self.rows)
        return torch.cat([_swiglu(gate_up[i : i + self.rows]) for i in rows])


def _swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _paths_agree(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether silu gives every finite value of a 16-bit dtype the same bits on the vector path
    (contiguous, in calls too small to split) and the scalar one (strided)."""
    if device.type != "cpu" or dtype not in (torch.bfloat16, torch.float16):
        return False
    values = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    x = values[torch.isfinite(values)]
    x = x[: x.numel() - x.numel() % 64].contiguous()
    vector = torch.cat([F.silu(x[i : i + _SERIAL]) for i in range(0, x.numel(), _SERIAL)])
    strided = torch.empty(2 * x.numel(), dtype=dtype)[::2]
    strided.copy_(x)
    return torch.equal(vector, F.silu(strided))


def _probe_rows(ffn: int, dtype: torch.dtype, device: torch.device) -> int:
    """The largest count up to _MAX_ROWS at which every smaller count keeps rows' bits."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(_MAX_ROWS, 2 * ffn, generator=gen).to(device=device, dtype=dtype)
    alone = torch.cat([_swiglu(x[i : i + 1]) for i in range(_MAX_ROWS)])
    rows = 1
    for m in range(2, _MAX_ROWS + 1):
        if not torch.equal(_swiglu(x[:m]), alone[:m]):
            break
        rows = m
    return rows
