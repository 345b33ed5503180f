"""SwiGLU, silu(gate) * up, with each row's bits independent of how many rows share the call.

Invariant: ATen splits an elementwise op across threads by element count, and the elements at a
split may take a scalar path that rounds differently from the vector one (float32 silu: about 4%
of inputs differ); rows are fed in calls of at most `rows` rows, a count up to which a probe saw
every row keep the bits it has alone (a call of one row is always split the same way).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_MAX_ROWS = 64


class SwiGLU:
    def __init__(self, ffn: int, dtype: torch.dtype, device: torch.device) -> None:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(_MAX_ROWS, 2 * ffn, generator=gen).to(device=device, dtype=dtype)
        alone = torch.cat([_swiglu(x[i : i + 1]) for i in range(_MAX_ROWS)])
        self.rows = 1
        for m in range(2, _MAX_ROWS + 1):
            if not torch.equal(_swiglu(x[:m]), alone[:m]):
                break
            self.rows = m

    def __call__(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up: [T, 2F] (gate, then up) -> [T, F]."""
        if gate_up.shape[0] <= self.rows:
            return _swiglu(gate_up)
        rows = range(0, gate_up.shape[0], self.rows)
        return torch.cat([_swiglu(gate_up[i : i + self.rows]) for i in rows])


def _swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
