"""The paged KV pool's tensors and the attention that reads and writes them.

Invariant: K/V of token position p of a sequence live at flat slot
table[p // block_size] * block_size + p % block_size of every layer; nothing else writes there.
Every attention call has one of two query shapes, one token or one tile of `tile_tokens` tokens
per batch element (backend.model.attention_plan probes that both give a query the same bits).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from backend.model.attend import attend
from backend.model.attention_plan import AttentionPlan, plan_attention
from backend.model.config import ModelConfig
from backend.model.native_decode import DecodeAttention, PromptAttention
from backend.model.paged_gpu import PagedDecodeAttention

OwnAttention = DecodeAttention | PagedDecodeAttention  # our kernels, reading the pool in place


@dataclass(frozen=True, slots=True)
class AttnGroup:
    """Queries attended together: B elements of S query tokens each (the n tokens of `rows`,
    packed contiguously; the last element padded when n < B * S), every element reading its own
    context or, with one row of `blocks`, one shared context."""

    rows: slice  # the group's queries in the packed step, ordered (b, s)
    batch: int  # B
    span: int  # S
    blocks: torch.Tensor  # [B or 1, nb] block ids of the context read (L = nb * bs)
    mask: torch.Tensor | None  # [B, 1, G*S or 1, L] bool, True = attend; None = attend to all
    # [B] int32 context lengths: queries our own kernel attends in place (blocks int32, one
    # table per query, no mask): decodes, or with `prompts` the step's prompt rows
    ends: torch.Tensor | None = None
    prompts: bool = False


class KVPool:
    """Per-layer K and V tensors [num_blocks, block_size, n_kv_heads, head_dim], allocated once
    as views of one tensor so a block can be zeroed across all layers in one operation."""

    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        shape = (config.n_layers, num_blocks, block_size, config.n_kv_heads, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.k_cache = list(self.k.unbind(0))
        self.v_cache = list(self.v.unbind(0))
        # Per layer [num_blocks * block_size, n_kv_heads, head_dim]: the slots new K/V go to.
        self.k_slots = [t.view(-1, config.n_kv_heads, config.head_dim) for t in self.k_cache]
        self.v_slots = [t.view(-1, config.n_kv_heads, config.head_dim) for t in self.v_cache]
        self.config = config
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.plan: AttentionPlan = plan_attention(config, block_size, dtype, device)

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def zero_blocks(self, ids: torch.Tensor) -> None:
        """ids: [n] block ids (on the pool's device) -> those blocks hold zeros in every layer."""
        self.k[:, ids] = 0
        self.v[:, ids] = 0

    def attention(self, slots: torch.Tensor, groups: list[AttnGroup]) -> PagedAttention:
        return PagedAttention(self, slots, groups)


class PagedAttention:
    """One step's attention: writes the new K/V at `slots`, then attends each group over the
    context gathered from the pool, or, for the queries of our own kernels (decodes, and prompt
    rows), read where it lies. Implements backend.model.llama.Attention."""

    def __init__(self, pool: KVPool, slots: torch.Tensor, groups: list[AttnGroup]) -> None:
        self.pool = pool
        self.slots = slots  # [T]
        self.groups = groups
        cfg = pool.config
        self.n_kv = cfg.n_kv_heads
        self.d = cfg.head_dim
        self._ids = [g.blocks.view(-1) for g in groups]  # once per step, not per layer
        # Queries our kernels attend, read in place: tables and slots checked once per step
        # (on the CPU; on CUDA by the runner, before they reach the device).
        self._own: list[OwnAttention | None] = [_own(pool, g, self.slots[g.rows]) for g in groups]
        # Generated tokens our CPU kernel attends (always the first group), which the model's
        # own layers (backend.model.native_decode) run themselves.
        first = self._own[0] if groups and not groups[0].prompts else None
        self.decodes = first if isinstance(first, DecodeAttention) else None
        # The rest, numbered from the first row after the decodes (see `prompt`).
        skip = self.decodes.rows if self.decodes is not None else 0
        rest = groups[1:] if skip else groups
        self._rest = [replace(g, rows=slice(g.rows.start - skip, g.rows.stop - skip)) for g in rest]
        self._rest_ids = self._ids[len(groups) - len(rest) :]
        self._rest_own = self._own[len(groups) - len(rest) :]
        self._skip = skip

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        # q: [T, Hq, D]; k, v: [T, Hkv, D]
        pool = self.pool
        pool.k_slots[layer].index_copy_(0, self.slots, k)
        pool.v_slots[layer].index_copy_(0, self.slots, v)
        return self._attend(layer, q, self.groups, self._ids, self._own)

    def prompt(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The rows after the decodes' only (the model runs those itself, see
        backend.model.native_decode): q: [T - B, Hq, D]; k, v: [T - B, Hkv, D]."""
        slots, pool = self.slots[self._skip :], self.pool
        pool.k_slots[layer].index_copy_(0, slots, k)
        pool.v_slots[layer].index_copy_(0, slots, v)
        return self._attend(layer, q, self._rest, self._rest_ids, self._rest_own)

    def _attend(
        self,
        layer: int,
        q: torch.Tensor,
        groups: list[AttnGroup],
        ids: list[torch.Tensor],
        own: list[OwnAttention | None],
    ) -> torch.Tensor:
        k_cache, v_cache = self.pool.k_cache[layer], self.pool.v_cache[layer]
        if len(groups) == 1:
            if own[0] is not None:
                return own[0](layer, q)
            return self._group(groups[0], ids[0], q, k_cache, v_cache)
        out = q.new_empty(q.shape[0], q.shape[1] * self.d)
        for g, g_ids, kernel in zip(groups, ids, own, strict=True):
            if kernel is not None:
                out[g.rows] = kernel(layer, q[g.rows])
            else:
                out[g.rows] = self._group(g, g_ids, q[g.rows], k_cache, v_cache)
        return out

    def _group(
        self,
        g: AttnGroup,
        ids: torch.Tensor,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        # Whole blocks are gathered (fewer, larger copies than per-slot); the mask hides the tail.
        # index_select is a plain copy like advanced indexing, and several times cheaper per call.
        ctx, hkv, d = g.blocks.shape[0], self.n_kv, self.d
        kg = k_cache.index_select(0, ids).view(ctx, -1, hkv, d).transpose(1, 2)  # [B|1, Hkv, L, D]
        vg = v_cache.index_select(0, ids).view(ctx, -1, hkv, d).transpose(1, 2)
        rows = self.pool.plan.row_multiple
        return attend(q.view(q.shape[0], hkv, -1, d), kg, vg, g.batch, g.span, g.mask, rows)


def _own(pool: KVPool, g: AttnGroup, slots: torch.Tensor) -> OwnAttention | None:
    """The kernel of a group our kernels attend (`ends` set), or None for torch's attention."""
    if g.ends is None:
        return None
    heads = pool.config.n_heads
    if pool.k.device.type == "cuda":
        return PagedDecodeAttention(g.blocks, g.ends, pool.k, pool.v, heads)
    kind = PromptAttention if g.prompts else DecodeAttention
    return kind(g.blocks, g.ends, slots, pool.k, pool.v, heads)
