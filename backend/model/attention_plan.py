"""How prompt queries are grouped for attention, found by probing the host's attention kernel:
a query must get the bits it gets as a lone decode, whatever its chunk and batch.

Invariant: the plan admits only what the probe saw: decodes (one query token per batch element)
keep their bits at any batch size; with `own_spans` False they also keep them over any padded
context span, else every query attends over its own span (its position's block end) only; prompt
queries, in tiles of `tile_tokens` tokens sharing a context, get those same bits; every call pads
each KV head's query rows to a multiple of `row_multiple`, the smallest the probe saw hold. Where
decodes do not keep them even so, `invariant` is False and the start-up log says so. With
`own_decodes`, every generated token (decodes, and a preempted sequence's tokens computed again)
is attended as a decode by our own kernel (backend.model.native), which keeps a query's bits at
any batch and span by construction; with `own_prompts` so are prompt queries, by our prompt
kernel (any chunk, batch or thread), else they keep the kernel probed here. On CUDA, where
Triton runs, generated tokens go to our decode kernel (backend.model.paged_gpu) the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from backend.model import native, paged_gpu
from backend.model.attend import attend, block_pieces, decode_mask, tile_mask
from backend.model.config import ModelConfig

# The CPU flash kernel attends up to 32 query rows as one block: a tile of G heads x t tokens
# within that is one block, so no row shares a block with another tile's.
_TILE_ROWS = 32
# The probe's context: past 512 positions the kernel splits the keys into blocks.
_CONTEXT = 640
# Query rows per KV head are padded to a multiple of one of these, the smallest that holds: the
# kernel sizes each thread's scratch by the row count, and on hosts whose matrix products round
# by alignment (MKL on AVX2: 16 bytes) a query's bits follow the thread it lands on.
_ROW_MULTIPLES = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class AttentionPlan:
    tile_tokens: int
    own_spans: bool  # each query attends over its own block-rounded span, never a padded one
    invariant: bool
    row_multiple: int = 1  # each KV head's query rows padded to a multiple of this
    own_decodes: bool = False  # generated tokens attend through our kernel, read in place
    own_prompts: bool = False  # so do prompt tokens (through our prompt kernel)

    def describe(self) -> str:
        if self.own_decodes and self.own_prompts:
            return (
                "attention: our kernels for decodes and prompts, read in place; "
                "batch invariance holds"
            )
        spans = "own spans" if self.own_spans else "padded spans"
        rows = f", query rows padded to {self.row_multiple}s" if self.row_multiple > 1 else ""
        held = "holds" if self.invariant else "does NOT hold"
        decodes = "; decodes: our kernel, read in place" if self.own_decodes else ""
        return (
            f"attention: prompt tiles of {self.tile_tokens}, {spans}{rows}; "
            f"batch invariance {held}{decodes}"
        )


def plan_attention(
    config: ModelConfig, block_size: int, dtype: torch.dtype, device: torch.device
) -> AttentionPlan:
    span = -(-_CONTEXT // block_size) * block_size
    q, k, v = _cancelling(span, config, block_size, dtype, device)
    tile = max(1, _TILE_ROWS // config.group)
    best = AttentionPlan(1, True, False)
    for multiple in _ROW_MULTIPLES:  # padding costs compute: the smallest that holds wins
        plan = _plan(_Probe(q, k, v, block_size, multiple), config.group, tile)
        if (plan.invariant, plan.tile_tokens) > (best.invariant, best.tile_tokens):
            best = plan
        if best.invariant and best.tile_tokens == tile:
            break
    if native.attends(config.head_dim, dtype, device):
        prompts = config.group <= native.PROMPT_GROUP_MAX
        return replace(best, own_decodes=True, own_prompts=prompts)
    heads = (config.n_heads, config.n_kv_heads, config.head_dim)
    if device.type == "cuda" and paged_gpu.checked(device, dtype, *heads) is None:
        return replace(best, own_decodes=True)  # our Triton kernel; prompts stay probed
    return best


def _plan(probe: _Probe, group: int, tile: int) -> AttentionPlan:
    if not probe.batches_keep_bits():
        return AttentionPlan(1, True, False, probe.rows)
    own = not probe.padded_spans_keep_bits()
    if tile > 1 and not probe.tiles_keep_bits(group, tile, own):
        tile = 1  # one query token per element: the decodes' own shape
    return AttentionPlan(tile, own, True, probe.rows)


def _cancelling(
    span: int, config: ModelConfig, block_size: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q: [L, Hkv, G, D]; k, v: [1, Hkv, L, D], laid out as a gathered context. In each block,
    the key half a block on repeats the one before it and its value is that value negated, so a
    query's output is mostly a rounding residue: another summation order shows in its bits."""
    gen = torch.Generator().manual_seed(0)
    hkv, d, half = config.n_kv_heads, config.head_dim, block_size // 2
    q = torch.randn(span, hkv, config.group, d, generator=gen)
    k, v = torch.randn(2, span, hkv, d, generator=gen).to(dtype).float()
    if half:
        first = torch.arange(span).view(-1, block_size)[:, :half].reshape(-1)
        k[first + half], v[first + half] = k[first], -v[first]
    q = q.to(device=device, dtype=dtype)
    k, v = (t.to(device=device, dtype=dtype).transpose(0, 1).unsqueeze(0) for t in (k, v))
    return q, k, v


class _Probe:
    def __init__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bs: int, rows: int
    ) -> None:
        self.q, self.k, self.v, self.bs, self.rows = q, k, v, bs, rows
        self.span = q.shape[0]
        # Each query as a decode over its own span, with the other queries of its block.
        own = [self._decodes(s, s + bs, s + bs) for s in range(0, self.span, bs)]
        self.alone = torch.cat(own)

    def _own_span(self, end: int) -> int:
        return -(-end // self.bs) * self.bs

    def _decodes(self, start: int, end: int, span: int) -> torch.Tensor:
        """Queries [start, end) as a batch of decodes over the first `span` positions."""
        ends = torch.arange(start + 1, end + 1, device=self.q.device)
        mask = None if end - start == 1 and end == span else decode_mask(ends, span)
        k, v = self.k[:, :, :span], self.v[:, :, :span]
        return attend(self.q[start:end], k, v, end - start, 1, mask, self.rows)

    def batches_keep_bits(self) -> bool:
        """Some queries truly alone against their block's batch."""
        for p in sorted({0, self.bs - 1, self.bs, 200, 511, 512, self.span - 1}):
            alone = self._decodes(p, p + 1, self._own_span(p + 1))
            if not torch.equal(alone, self.alone[p : p + 1]):
                return False
        return True

    def padded_spans_keep_bits(self) -> bool:
        spans = sorted({self._own_span(s) for s in (1, 2 * self.bs, 200, 512, 513, self.span)})
        return all(torch.equal(self._decodes(0, s, s), self.alone[:s]) for s in spans)

    def tiles_keep_bits(self, group: int, tile: int, own_spans: bool) -> bool:
        last = self.span
        chunks = [(0, last), (0, 1), (1, tile + 2), (self.bs + 3, 2 * tile + 1)]
        chunks += [(last // 3, last // 3 + 5), (last - 2 * tile - 3, last)]
        for start, end in chunks:
            pieces = block_pieces(start, end, self.bs) if own_spans else [(start, end)]
            for a, b in pieces:
                span = self._own_span(b)
                mask = tile_mask(a, b, span, group, tile, self.q.device)
                k, v = self.k[:, :, :span], self.v[:, :, :span]
                got = attend(self.q[a:b], k, v, mask.shape[0], tile, mask, self.rows)
                if not torch.equal(got, self.alone[a:b]):
                    return False
        return True
