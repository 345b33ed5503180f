"""The elementwise ops of a step's prompt rows in our kernels (backend.model.native_c): RMSNorm
into bfloat16, rotary embedding in place and SwiGLU, each a single call over every row where
torch runs several ops and their copies.

Invariant: each row is computed alone, in one fixed order, by the same code as our decode
layers': its bits never depend on the step's other rows, its chunk or the thread count. A
position past the rotary table is refused before any call.
"""

from __future__ import annotations

import torch

from backend.model import native
from backend.model.config import ModelConfig


class RowOps:
    """Built once per model: cos, sin [positions, D] float32 (sin's first half negated)."""

    def __init__(self, config: ModelConfig, cos: torch.Tensor, sin: torch.Tensor) -> None:
        lib = native.library()
        if lib is None or not native.attends(config.head_dim, torch.bfloat16, cos.device):
            raise RuntimeError(f"our row ops are not used here: {native.unavailable()}")
        self.config = config
        self._cos, self._sin = cos.float().contiguous(), sin.float().contiguous()
        self._norm, self._rope = lib.kvfence_rms_norm, lib.kvfence_rope
        self._swiglu = lib.kvfence_swiglu

    def ends(self, positions: torch.Tensor) -> torch.Tensor:
        """positions: [T] -> [T] int32 positions plus one, once a step: checked to lie within
        the rotary table."""
        if positions.numel() and (
            int(positions.min()) < 0 or int(positions.max()) >= self._cos.shape[0]
        ):
            raise ValueError("a position outside the rotary table")
        return (positions + 1).to(torch.int32).contiguous()

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x: [T, H] float32, contiguous; weight: [H] float32 -> [T, H] bfloat16."""
        t, hidden = x.shape
        dense = x.is_contiguous() and weight.is_contiguous() and weight.shape == (hidden,)
        if not dense or x.dtype != torch.float32 or weight.dtype != torch.float32:
            raise ValueError(
                f"rows {tuple(x.shape)} {x.dtype} and a {tuple(weight.shape)} {weight.dtype} norm"
            )
        h = torch.empty(t, hidden, dtype=torch.bfloat16)
        if t:
            self._norm(
                x.data_ptr(), weight.data_ptr(), h.data_ptr(), t, hidden, self.config.rms_eps,
                torch.get_num_threads(),
            )  # fmt: skip
        return h

    def rope_(self, qkv: torch.Tensor, ends: torch.Tensor) -> None:
        """Rotates the q and k heads of each row of qkv ([T, q_size + 2 kv_size] bfloat16,
        contiguous) in place, row t at position ends[t] - 1 (from `ends`)."""
        c = self.config
        width = c.q_size + 2 * c.kv_size
        t = qkv.shape[0]
        if qkv.shape != (t, width) or not qkv.is_contiguous() or qkv.dtype != torch.bfloat16:
            raise ValueError(f"qkv rows {tuple(qkv.shape)} {qkv.dtype}: [{t}, {width}] bfloat16")
        if ends.shape != (t,) or ends.dtype != torch.int32:
            raise ValueError("one int32 end per row, from RowOps.ends")
        if t:
            self._rope(
                qkv.data_ptr(), t, width, c.n_heads + c.n_kv_heads, c.head_dim,
                self._cos.data_ptr(), self._sin.data_ptr(), ends.data_ptr(),
                torch.get_num_threads(),
            )  # fmt: skip

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up: [T, 2F] bfloat16 (gate, then up), contiguous -> silu(gate) * up, [T, F]."""
        t, width = gate_up.shape
        if width % 2 or not gate_up.is_contiguous() or gate_up.dtype != torch.bfloat16:
            raise ValueError(f"gate_up rows {tuple(gate_up.shape)} {gate_up.dtype}")
        out = torch.empty(t, width // 2, dtype=torch.bfloat16)
        if t:
            self._swiglu(gate_up.data_ptr(), out.data_ptr(), t, width // 2, torch.get_num_threads())
        return out
