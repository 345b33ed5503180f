"""Attention of one group of queries over a gathered context, in the two query shapes the model
uses: one token per batch element (decodes) or one tile of several tokens per element (prompts).

Invariant: a query attends exactly the positions its mask allows, and its G heads ride along the
query axis of their shared KV head (no K/V copies per head); masks are built only here.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    batch: int,
    span: int,
    mask: torch.Tensor | None,
    row_multiple: int = 1,
) -> torch.Tensor:
    """q: [n, Hkv, G, D] (n <= batch * span), k, v: [batch or 1, Hkv, L, D] -> [n, Hkv * G * D].

    The G query heads sharing a KV head ride along the query axis: no K/V copies per head. Each
    KV head's G * S query rows are padded with zero rows to a multiple of `row_multiple`: the
    CPU kernel gives every thread scratch sized by that row count, and where its matrix
    products round by the scratch's alignment a query's bits follow the thread it lands on."""
    n, hkv, grp, d = q.shape
    b, s = batch, span
    if n < b * s:  # the last tile's padding: its rows are computed and dropped
        q = torch.cat((q, q.new_zeros(b * s - n, hkv, grp, d)))
    qg = q.view(b, s, hkv, grp, d)
    if s > 1:
        qg = qg.permute(0, 2, 3, 1, 4)
    qg = qg.reshape(b, hkv, grp * s, d)
    rows = grp * s
    extra = -rows % row_multiple
    if extra:  # padding rows attend like the last row: never a row with nothing to attend
        qg = torch.cat((qg, qg.new_zeros(b, hkv, extra, d)), dim=2)
        if mask is not None and mask.shape[2] > 1:
            mask = torch.cat((mask, mask[:, :, -1:].expand(-1, -1, extra, -1)), dim=2)
    if k.shape[0] < b:  # one context shared by every tile: a broadcast, not a copy
        k, v = k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1)
    o = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask)  # [B, Hkv, G*S + extra, D]
    if extra:
        o = o[:, :, :rows]
    if s == 1:
        return o.reshape(b, hkv * grp * d)
    return o.reshape(b, hkv, grp, s, d).permute(0, 3, 1, 2, 4).reshape(b * s, hkv * grp * d)[:n]


def decode_mask(ends: torch.Tensor, span: int) -> torch.Tensor:
    """ends: [B] context lengths -> [B, 1, 1, span]: element b attends to positions < ends[b]."""
    positions = torch.arange(span, device=ends.device).unsqueeze(0)
    return (positions < ends.unsqueeze(1)).view(ends.shape[0], 1, 1, span)


def tile_mask(
    start: int, end: int, span: int, group: int, tile_tokens: int, device: torch.device
) -> torch.Tensor:
    """Causal mask of queries [start, end) in tiles of `tile_tokens` (the last one padded with
    its last query) -> [tiles, 1, group * tile_tokens, span], query rows ordered (head, token)."""
    tiles = -(-(end - start) // tile_tokens)
    q_pos = torch.arange(start, start + tiles * tile_tokens, device=device).clamp_(max=end - 1)
    mask = torch.arange(span, device=device).unsqueeze(0) <= q_pos.unsqueeze(1)  # [tiles * t, L]
    mask = mask.view(tiles, 1, tile_tokens, span).expand(tiles, group, tile_tokens, span)
    return mask.reshape(tiles, 1, group * tile_tokens, span)


def block_pieces(start: int, end: int, block_size: int) -> list[tuple[int, int]]:
    """Positions [start, end) cut at block boundaries: each piece's queries share their span."""
    bounds = [start, *range(start - start % block_size + block_size, end, block_size), end]
    return list(itertools.pairwise(bounds))
