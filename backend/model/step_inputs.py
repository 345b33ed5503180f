"""Packs one step plan into the index tensors the forward pass needs, built once per step.

Invariant: decode chunks (one new token) come first and form one batched attention group;
every longer chunk is its own group; sampled rows follow the order of `sampled`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from backend.engine.plan import Chunk
from backend.model.kv_pool import AttnGroup


@dataclass(frozen=True, slots=True)
class StepInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slots: torch.Tensor  # [T] flat KV slots the new tokens are written to
    groups: list[AttnGroup]
    logits_index: torch.Tensor  # [N] packed rows whose next token is sampled
    sampled: list[Chunk]  # N chunks, in logits row order


def validate_chunk(chunk: Chunk, block_size: int, num_blocks: int, max_positions: int) -> None:
    """A bad table would index out of the pool (a device assert on CUDA): refuse it here."""
    end = chunk.start + len(chunk.token_ids)
    if not chunk.token_ids or chunk.start < 0:
        raise ValueError(f"sequence {chunk.seq_id}: empty chunk or negative start")
    if end > max_positions:
        raise ValueError(f"sequence {chunk.seq_id}: position {end} beyond the model's context")
    if len(chunk.block_table) * block_size < end:
        raise ValueError(f"sequence {chunk.seq_id}: block table does not cover position {end}")
    if min(chunk.block_table) < 0 or max(chunk.block_table) >= num_blocks:
        raise ValueError(f"sequence {chunk.seq_id}: block id outside the pool")


def build_step_inputs(
    chunks: Sequence[Chunk], block_size: int, group: int, device: torch.device
) -> StepInputs:
    decodes = [c for c in chunks if len(c.token_ids) == 1]
    prefills = [c for c in chunks if len(c.token_ids) > 1]
    ids: list[int] = [c.token_ids[0] for c in decodes]
    positions: list[int] = [c.start for c in decodes]
    groups: list[AttnGroup] = []
    slot_parts: list[torch.Tensor] = []
    if decodes:
        blocks, mask = _decode_context(decodes, block_size, device)
        groups.append(AttnGroup(slice(0, len(decodes)), len(decodes), 1, blocks, mask))
        rows_t = torch.arange(len(decodes), device=device)
        pos_t = torch.tensor(positions, device=device)
        slot_parts.append(blocks[rows_t, pos_t // block_size] * block_size + pos_t % block_size)
    sampled = [c for c in decodes if c.sample]
    rows = [i for i, c in enumerate(decodes) if c.sample]
    offset = len(decodes)
    for c in prefills:
        n = len(c.token_ids)
        end = c.start + n
        table = c.block_table[: -(-end // block_size)]
        span = len(table) * block_size
        q_pos = torch.arange(c.start, end, device=device)
        # Causal: query at position p sees keys 0..p, which also hides the last block's tail.
        mask = torch.arange(span, device=device).unsqueeze(0) <= q_pos.unsqueeze(1)  # [n, L]
        mask = mask.repeat(group, 1).view(1, 1, group * n, span)
        blocks = torch.tensor(table, device=device).unsqueeze(0)  # [1, nb]
        groups.append(AttnGroup(slice(offset, offset + n), 1, n, blocks, mask))
        slot_parts.append(_table_slots(table, block_size, device)[c.start : end])
        ids.extend(c.token_ids)
        positions.extend(range(c.start, end))
        if c.sample:
            sampled.append(c)
            rows.append(offset + n - 1)
        offset += n
    return StepInputs(
        input_ids=torch.tensor(ids, device=device),
        positions=torch.tensor(positions, device=device),
        slots=torch.cat(slot_parts),
        groups=groups,
        logits_index=torch.tensor(rows, device=device, dtype=torch.long),
        sampled=sampled,
    )


def _table_slots(table: Sequence[int], block_size: int, device: torch.device) -> torch.Tensor:
    """[len(table) * block_size] flat slots of positions 0.. in table order."""
    blocks = torch.tensor(table, device=device).unsqueeze(1) * block_size
    return (blocks + torch.arange(block_size, device=device)).view(-1)


def _decode_context(
    decodes: Sequence[Chunk], block_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """blocks: [B, nb] each sequence's context blocks (padded), mask: [B, 1, 1, L] or None."""
    lengths = [c.start + 1 for c in decodes]
    n_blocks = -(-max(lengths) // block_size)
    span = n_blocks * block_size
    # Short tables are padded with block 0: those positions are masked out.
    blocks = torch.tensor(
        [_padded(c.block_table[:n_blocks], n_blocks) for c in decodes], device=device
    )
    if min(lengths) == span:
        return blocks, None
    lens = torch.tensor(lengths, device=device).unsqueeze(1)
    mask = torch.arange(span, device=device).unsqueeze(0) < lens  # [B, L]
    return blocks, mask.view(len(decodes), 1, 1, span)


def _padded(table: Sequence[int], n: int) -> list[int]:
    return [*table, *([0] * (n - len(table)))]
