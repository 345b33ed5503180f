"""Our kernels for the elementwise ops of prompt rows: RMSNorm, rotary embedding and SwiGLU agree
with float32 (rotary bit for bit with the same operations in torch), give a row the same bits
alone and among others on any thread count, and refuse a position past the rotary table.
Skipped where our kernels are not used (no AVX-512 BF16 or no compiler)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from backend.model import native
from backend.model.llama import _rope_tables
from backend.model.native_rows import RowOps
from tests.kit.models import TINY

pytestmark = pytest.mark.skipif(
    native.unavailable() is not None,
    reason=f"our kernels are not used here: {native.unavailable()}",
)

CFG = replace(TINY, hidden=72, head_dim=32, ffn=100, max_positions=64)  # tails past 16s


@pytest.fixture(scope="module")
def ops() -> RowOps:
    return RowOps(CFG, *_rope_tables(CFG, torch.device("cpu")))


def _rows(n: int, width: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, width, generator=gen) * scale).to(torch.bfloat16)


def test_rms_norm_agrees_with_float32(ops: RowOps) -> None:
    x = _rows(9, CFG.hidden, 0).float()
    w = torch.rand(CFG.hidden, generator=torch.Generator().manual_seed(1)) + 0.5
    ref = F.rms_norm(x, (CFG.hidden,), w, CFG.rms_eps)
    torch.testing.assert_close(ops.rms_norm(x, w).float(), ref, rtol=1e-2, atol=1e-2)


def test_rotary_gives_torchs_bits_for_the_same_operations(ops: RowOps) -> None:
    width = CFG.q_size + 2 * CFG.kv_size
    qkv = _rows(7, width, 2)
    positions = torch.tensor([0, 1, 5, 17, 30, 62, 63])
    mine = qkv.clone()
    ops.rope_(mine, ops.ends(positions))
    cos, sin = _rope_tables(CFG, torch.device("cpu"))
    heads = CFG.n_heads + CFG.n_kv_heads
    t = qkv[:, : heads * CFG.head_dim].float().view(7, heads, CFG.head_dim)
    c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
    ref = (t * c + t.roll(CFG.head_dim // 2, -1) * s).to(torch.bfloat16).view(7, -1)
    assert torch.equal(mine[:, : heads * CFG.head_dim], ref)
    assert torch.equal(mine[:, heads * CFG.head_dim :], qkv[:, heads * CFG.head_dim :])  # v


def test_swiglu_agrees_with_float32_far_into_both_tails(ops: RowOps) -> None:
    gate_up = _rows(5, 2 * CFG.ffn, 3, scale=40.0)  # e^-g from about e^-100 to e^100
    gate, up = gate_up.float().chunk(2, dim=-1)
    ref = F.silu(gate) * up
    torch.testing.assert_close(ops.swiglu(gate_up).float(), ref, rtol=1e-2, atol=1e-3)


def test_a_row_gets_the_same_bits_alone_and_among_others_on_any_thread_count(
    ops: RowOps,
) -> None:
    n, width = 11, CFG.q_size + 2 * CFG.kv_size
    x, qkv, gate_up = _rows(n, CFG.hidden, 4).float(), _rows(n, width, 5), _rows(n, 2 * CFG.ffn, 6)
    w = torch.ones(CFG.hidden)
    ends = ops.ends(torch.arange(20, 20 + n))

    def run(rows: slice) -> tuple[torch.Tensor, ...]:
        rotated = qkv[rows].clone()
        ops.rope_(rotated, ends[rows].contiguous())
        normed = ops.rms_norm(x[rows].contiguous(), w)
        return normed, rotated, ops.swiglu(gate_up[rows].contiguous())

    alone = [run(slice(i, i + 1)) for i in range(n)]
    threads = torch.get_num_threads()
    try:
        for count in sorted({1, 2, threads}):
            torch.set_num_threads(count)
            together = run(slice(0, n))
            for i in range(n):
                assert all(torch.equal(a[0], b[i]) for a, b in zip(alone[i], together, strict=True))
    finally:
        torch.set_num_threads(threads)


def test_a_position_past_the_rotary_table_is_refused(ops: RowOps) -> None:
    with pytest.raises(ValueError, match="rotary table"):
        ops.ends(torch.tensor([3, CFG.max_positions]))
    with pytest.raises(ValueError, match="rotary table"):
        ops.ends(torch.tensor([-1]))


def test_rows_or_a_norm_of_another_shape_or_dtype_are_refused(ops: RowOps) -> None:
    x, w = torch.ones(3, CFG.hidden), torch.ones(CFG.hidden)
    for rows, weight in [(x, w.double()), (x, w[:-1]), (x.t().contiguous().t(), w), (x.half(), w)]:
        with pytest.raises(ValueError, match="norm"):
            ops.rms_norm(rows, weight)
    with pytest.raises(ValueError, match="bfloat16"):
        ops.rope_(torch.ones(3, CFG.q_size + 2 * CFG.kv_size), ops.ends(torch.arange(3)))
