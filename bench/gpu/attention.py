"""Decode attention alone, two ways over the same paged pool: our kernel reading each context in
place (backend.model.paged_gpu) against the usual path's gathering copy of the context's blocks
and torch's scaled_dot_product_attention under a mask (backend.model.kv_pool's `_group`).

Invariant: both ways attend the same queries over the same tables and lengths (every context
the row's length, tables shuffled across the pool), each call is timed after a device sync, and
the two answers are compared before any time is taken.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from backend.model import paged_gpu
from backend.model.attend import attend, decode_mask
from backend.model.config import ModelConfig

BLOCK = 16


def rows(
    config: ModelConfig, device: torch.device, dtype: torch.dtype, batches: list[int],
    contexts: list[int], repeats: int,
) -> list[dict[str, Any]]:  # fmt: skip
    """One row per (batch, context): microseconds per call both ways (median of `repeats`)."""
    found = []
    for context in contexts:
        for batch in batches:
            found.append(_row(config, device, dtype, batch, context, repeats))
    return found


def _row(
    config: ModelConfig, device: torch.device, dtype: torch.dtype, batch: int, context: int,
    repeats: int,
) -> dict[str, Any]:  # fmt: skip
    hkv, d, heads = config.n_kv_heads, config.head_dim, config.n_heads
    per = -(-context // BLOCK)
    blocks = batch * per
    gen = torch.Generator().manual_seed(batch * 7919 + context)
    k, v = (torch.randn(1, blocks, BLOCK, hkv, d, generator=gen).to(dtype) for _ in "kv")
    q = torch.randn(batch, heads, d, generator=gen).to(dtype)
    table = torch.randperm(blocks, generator=gen).view(batch, per).to(torch.int32)
    ends = torch.full((batch,), context, dtype=torch.int32)
    k, v, q, table, ends = (t.to(device) for t in (k, v, q, table, ends))
    ours = paged_gpu.PagedDecodeAttention(table, ends, k, v, heads)
    span = per * BLOCK
    mask = None if span == context else decode_mask(ends, span)
    ids = table.long().view(-1)

    def gathered() -> torch.Tensor:
        kg = k[0].index_select(0, ids).view(batch, -1, hkv, d).transpose(1, 2)
        vg = v[0].index_select(0, ids).view(batch, -1, hkv, d).transpose(1, 2)
        return attend(q.view(batch, hkv, -1, d), kg, vg, batch, 1, mask)

    off = float((ours(0, q).float() - gathered().float()).abs().max())
    return {
        "batch": batch,
        "context": context,
        "ours_us": _time(lambda: ours(0, q), device, repeats),
        "gathered_us": _time(gathered, device, repeats),
        "largest_difference": round(off, 5),
    }


def _time(call: Callable[[], torch.Tensor], device: torch.device, repeats: int) -> float:
    call()  # compiled and warmed
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e6, 1)
