"""Decode attention on CUDA, read in place from the paged pool by a Triton kernel: each query
walks its own block table up to its context's end (read on the device, so a CUDA graph replays
the step with new tables and ends written into the same tensors), with no gathering copy.

Invariant: a query's bits depend only on its own context and query: one program per (query,
KV head) runs its tiles in one fixed order, with a tile size fixed by the heads' shape, so a
query gets the same bits alone, in any batch and at any B; an empty context gives zeros.
Nothing outside the pool is read: a table entry outside the pool, or a context longer than its
table, makes that query's row NaN.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # triton is imported on first use (_kernel): not needed to import this
    import triton.language as tl  # type: ignore[import-untyped, import-not-found, unused-ignore]

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_MAX_HEAD_DIM = 256
_TILE_ELEMENTS = 8192  # the [G, BLOCK_N, D] float32 products one tile holds
_WARPS = 4


def _decode_kernel(
    q: tl.tensor,  # [B, Hq, D], rows q_row apart
    q_row: tl.tensor,
    k: tl.tensor,  # one layer's [num_blocks, BLOCK_SIZE, HKV, D]
    v: tl.tensor,
    blocks: tl.tensor,  # [B, nb] int32
    nb: tl.tensor,
    ends: tl.tensor,  # [B] int32
    out: tl.tensor,  # [B, Hq * D]
    num_blocks: tl.tensor,
    scale: tl.tensor,
    BLOCK_SIZE: tl.constexpr,
    HKV: tl.constexpr,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
) -> None:
    """Program (b, h): query b's G heads over KV head h, an online softmax in float32."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D)
    n = tl.arange(0, BLOCK_N)
    heads = h * G + g  # [G_PAD]
    live = g < G
    qg = tl.load(q + b * q_row + heads[:, None] * D + d[None, :], mask=live[:, None], other=0.0)
    qg = qg.to(tl.float32) * scale  # [G_PAD, D]
    end = tl.load(ends + b)
    bad = ((end < 0) | (end > nb * BLOCK_SIZE)).to(tl.int32)
    end = tl.minimum(end, nb * BLOCK_SIZE)
    top = tl.full([G_PAD], float("-inf"), tl.float32)
    total = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D], tl.float32)
    # The bound is read on the device: a while loop, as range() over a loaded bound fails in
    # Triton 3.6's interpreter with numpy 2.4 (triton#9171).
    start = 0
    while start < end:
        pos = start + n  # [BLOCK_N]
        valid = pos < end
        blk = tl.load(blocks + b * nb + pos // BLOCK_SIZE, mask=valid, other=0)
        inside = (blk >= 0) & (blk < num_blocks)
        bad = tl.maximum(bad, tl.max((valid & ~inside).to(tl.int32), axis=0))
        read = valid & inside
        slot = blk.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
        at = (slot * HKV + h)[:, None] * D + d[None, :]  # [BLOCK_N, D]
        kt = tl.load(k + at, mask=read[:, None], other=0.0).to(tl.float32)
        s = tl.sum(qg[:, None, :] * kt[None, :, :], axis=2)  # [G_PAD, BLOCK_N]
        s = tl.where(valid[None, :], s, float("-inf"))
        new_top = tl.maximum(top, tl.max(s, axis=1))
        alpha = tl.exp(top - new_top)
        p = tl.exp(s - new_top[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        vt = tl.load(v + at, mask=read[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * vt[None, :, :], axis=1)
        top = new_top
        start += BLOCK_N
    result = acc / tl.where(total > 0, total, 1.0)[:, None]  # an empty context gives zeros
    result = tl.where(bad > 0, float("nan"), result)
    dst = out + b * (HKV * G * D) + heads[:, None] * D + d[None, :]
    tl.store(dst, result.to(out.dtype.element_ty), mask=live[:, None])


@functools.cache
def _kernel() -> tuple[Any, bool]:
    """The jitted kernel, and whether Triton interprets it on the CPU (TRITON_INTERPRET=1 when
    it was jitted). Raises ImportError where triton is not installed."""
    global tl  # the kernel's globals name it
    import triton  # type: ignore[import-untyped, import-not-found, unused-ignore]
    import triton.language as tl  # type: ignore[import-untyped, import-not-found, unused-ignore]

    # One compiled kernel for every table width and query row stride; triton.jit interprets
    # it where this knob is set.
    interpreted = bool(triton.knobs.runtime.interpret)
    return triton.jit(do_not_specialize=["q_row", "nb", "num_blocks"])(_decode_kernel), interpreted


def available(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """None where the kernel runs for this device, dtype and head width, else why not."""
    if dtype not in DTYPES:
        return f"{dtype} is not one of {', '.join(str(t) for t in DTYPES)}"
    if head_dim < 1 or head_dim > _MAX_HEAD_DIM or head_dim & (head_dim - 1):
        return f"head width {head_dim} is not a power of two up to {_MAX_HEAD_DIM}"
    if device.type not in ("cuda", "cpu"):
        return f"no kernel for {device.type}"
    try:
        _, interpreted = _kernel()
    except ImportError:
        return "triton is not installed"
    if device.type == "cpu" and not interpreted:
        return "a CPU device needs Triton's interpreter (TRITON_INTERPRET=1)"
    if device.type == "cpu":
        return None
    if interpreted:
        return "Triton interprets its kernels here (TRITON_INTERPRET=1): no CUDA launch"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    if dtype == torch.bfloat16 and torch.cuda.get_device_capability(device) < (8, 0):
        return "bfloat16 needs compute capability 8.0 or newer"
    return None


@functools.cache
def checked(
    device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int
) -> str | None:
    """None where the kernel runs here and agrees with float32 on a probe of this model's head
    shape (contexts of 1, 37 and 128 positions over a shuffled table), else why not. Remembered
    per shape: the start-up log names the reason where the kernel is not used."""
    reason = available(device, dtype, head_dim)
    if reason is not None:
        return reason
    from backend.model.native import reference_attention  # the CPU kernels' yardstick

    gen = torch.Generator().manual_seed(0)
    bs, lengths = 16, [1, 37, 128]
    pool = [torch.randn(1, 8, bs, kv_heads, head_dim, generator=gen).to(dtype) for _ in "kv"]
    q = torch.randn(len(lengths), heads, head_dim, generator=gen).to(dtype)
    table = torch.tensor([[7, 3, 5, 0, 1, 2, 4, 6]] * len(lengths), dtype=torch.int32)
    ends = torch.tensor(lengths, dtype=torch.int32)
    try:
        k, v = (t.to(device) for t in pool)
        got = PagedDecodeAttention(table.to(device), ends.to(device), k, v, heads)(0, q.to(device))
        got = got.float().cpu()
    except Exception as exc:  # a kernel that cannot be built or run here is not used
        return f"the kernel failed on a probe: {exc!r}"[:300]
    flat = [t[0].reshape(-1, kv_heads, head_dim) for t in pool]
    want = reference_attention(q, flat[0], flat[1], table, ends, bs)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3}.get(dtype, 1.6e-2)
    if not torch.allclose(got, want, atol=tol, rtol=tol):
        off = float((got - want).abs().max())
        return f"the kernel disagrees with float32 on a probe (by {off:.3g})"
    return None


def _tile(group: int, head_dim: int) -> int:
    """BLOCK_N for G_PAD = group heads: fixed by the heads' shape alone, never by B."""
    return max(16, min(64, _TILE_ELEMENTS // (group * head_dim)))


class PagedDecodeAttention:
    """One decode step's B queries, each over its own context in the pool.

    blocks: [B, nb] int32 block tables; ends: [B] int32 context lengths (query b attends
    positions [0, ends[b]) of its table, its own K/V already written); k, v: the pool, [layers,
    num_blocks, block_size, Hkv, D] contiguous. blocks and ends are kept, never copied: a caller
    may write new values into them between calls (a CUDA graph replay), and a call reads them
    only on the device. The first call compiles the kernel: make it before capturing a graph."""

    __slots__ = ("_args", "_k", "_v", "blocks", "ends")

    def __init__(
        self, blocks: torch.Tensor, ends: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        heads: int,
    ) -> None:  # fmt: skip
        _, _, _, kv_heads, head_dim = k.shape
        reason = available(k.device, k.dtype, head_dim)
        if reason is not None:
            raise RuntimeError(f"paged decode attention does not run here: {reason}")
        if (
            v.shape != k.shape
            or v.dtype != k.dtype
            or not (k.is_contiguous() and v.is_contiguous())
        ):
            raise ValueError("K and V are one dense pool each, of one shape and dtype")
        if blocks.dim() != 2 or ends.shape != blocks.shape[:1]:
            raise ValueError(f"tables {tuple(blocks.shape)} and ends {tuple(ends.shape)}")
        if blocks.dtype != torch.int32 or ends.dtype != torch.int32:
            raise ValueError(f"int32 tables and ends, not {blocks.dtype} and {ends.dtype}")
        if not (blocks.is_contiguous() and ends.is_contiguous()):
            raise ValueError("tables and ends are dense: a caller updates them in place")
        if blocks.device != k.device or ends.device != k.device:
            raise ValueError("tables, ends and the pool are on one device")
        if heads < 1 or heads % kv_heads:
            raise ValueError(f"{heads} query heads over {kv_heads} KV heads")
        self.blocks, self.ends = blocks, ends
        self._k, self._v = k, v
        group = heads // kv_heads
        padded = 1 << (group - 1).bit_length()
        self._args = (blocks.shape[0], heads, kv_heads, head_dim, group, padded)

    @property
    def rows(self) -> int:
        return self._args[0]

    def __call__(
        self, layer: int, q: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """q: [B, Hq, D] (rows may be strided, heads dense) -> out: [B, Hq * D] in q's dtype.
        Launches one kernel and nothing else: no host synchronisation, no value-dependent shape."""
        b, heads, kv_heads, d, group, padded = self._args
        k, v = self._k, self._v
        if q.shape != (b, heads, d) or q.stride(2) != 1 or q.stride(1) != d:
            raise ValueError(f"queries {tuple(q.shape)}: expected {(b, heads, d)}, heads dense")
        if q.dtype != k.dtype or q.device != k.device or not 0 <= layer < k.shape[0]:
            raise ValueError(f"{k.dtype} queries of a layer of the pool, not {q.dtype}, {layer}")
        if out is None:
            out = torch.empty(b, heads * d, dtype=q.dtype, device=q.device)
        elif out.shape != (b, heads * d) or out.dtype != q.dtype or not out.is_contiguous():
            raise ValueError(f"out {tuple(out.shape)} {out.dtype}: [{b}, {heads * d}] {q.dtype}")
        if b:
            kernel, _ = _kernel()
            kernel[(b, kv_heads)](
                q, q.stride(0), k[layer], v[layer], self.blocks, self.blocks.shape[1], self.ends,
                out, k.shape[1], d**-0.5, BLOCK_SIZE=k.shape[2], HKV=kv_heads, G=group,
                G_PAD=padded, D=d, BLOCK_N=_tile(padded, d), num_warps=_WARPS,
            )  # fmt: skip
        return out
