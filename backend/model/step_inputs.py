"""Packs one step plan into the index tensors the forward pass needs, built once per step.

Invariant: rows of tokens the model generated come first (`generated` of them), prompt tokens
after, so the projections run each kind apart whatever shares the step; a chunk that holds both
(a preempted sequence computed again) is cut in two at its prompt's end. Single generated tokens
(decodes) form one batched attention group (one per span under `own_spans`); every other piece
attends in query tiles of the plan's size, its own group (one per block under `own_spans`);
sampled rows follow the order of `sampled`. Under the plan's `own_decodes` every generated token,
a preempted sequence's computed again included, is a decode of that one group, and the group
carries each query's context length for our kernel; under `own_prompts` every prompt token is
one more group after it, each row with its own table and context length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from backend.engine.plan import Chunk
from backend.model.attend import block_pieces, decode_mask, tile_mask
from backend.model.attention_plan import AttentionPlan
from backend.model.kv_pool import AttnGroup

# Prompt queries attended in one call (whole tiles): fewer keys read than one call per chunk.
_CALL_TOKENS = 96


@dataclass(frozen=True, slots=True)
class StepInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slots: torch.Tensor  # [T] flat KV slots the new tokens are written to
    groups: list[AttnGroup]
    logits_index: torch.Tensor  # [N] packed rows whose next token is sampled
    sampled: list[Chunk]  # N chunks, in logits row order
    generated: int  # the first rows are tokens the model generated, the rest prompt tokens


@dataclass(frozen=True, slots=True)
class _Piece:
    """Positions [start, end) of one chunk, all of one kind."""

    chunk: Chunk
    start: int
    end: int


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
    if chunk.prompt_len < 1:
        raise ValueError(f"sequence {chunk.seq_id}: a prompt has at least one token")


def build_step_inputs(
    chunks: Sequence[Chunk],
    block_size: int,
    group: int,
    plan: AttentionPlan,
    device: torch.device,
) -> StepInputs:
    generated, prompt = _pieces(chunks)
    batches, longer = _arrange(generated, prompt, block_size, plan)
    order = [p for batch in batches for p in batch] + longer
    positions = torch.tensor([q for p in order for q in range(p.start, p.end)], device=device)
    built: list[tuple[AttnGroup, torch.Tensor]] = []
    offset = 0
    for batch in batches:
        built.append(_decode_group(batch, offset, block_size, device, plan.own_decodes))
        offset += len(batch)
    if plan.own_prompts and longer:
        built.append(_prompt_group(longer, positions[offset:], offset, block_size, device))
    else:
        for p in longer:
            built.append(_tile_group(p, offset, block_size, group, plan.tile_tokens, device))
            offset += p.end - p.start
    ids: list[int] = []
    rows: list[tuple[int, Chunk]] = []
    for p in order:
        c = p.chunk
        ids.extend(c.token_ids[p.start - c.start : p.end - c.start])
        if c.sample and p.end == c.start + len(c.token_ids):
            rows.append((len(ids) - 1, c))
    return StepInputs(
        input_ids=torch.tensor(ids, device=device),
        positions=positions,
        slots=torch.cat([slots for _, slots in built]),
        groups=[g for g, _ in built],
        logits_index=torch.tensor([r for r, _ in rows], device=device, dtype=torch.long),
        sampled=[c for _, c in rows],
        generated=sum(p.end - p.start for p in generated),
    )


def _pieces(chunks: Sequence[Chunk]) -> tuple[list[_Piece], list[_Piece]]:
    """Each chunk's generated and prompt positions, as (generated pieces, prompt pieces)."""
    generated: list[_Piece] = []
    prompt: list[_Piece] = []
    for c in chunks:
        end = c.start + len(c.token_ids)
        cut = min(max(c.prompt_len, c.start), end)
        if cut > c.start:
            prompt.append(_Piece(c, c.start, cut))
        if end > cut:
            generated.append(_Piece(c, cut, end))
    return generated, prompt


def _arrange(
    generated: list[_Piece], prompt: list[_Piece], block_size: int, plan: AttentionPlan
) -> tuple[list[list[_Piece]], list[_Piece]]:
    """(batches of decodes, pieces attended in tiles), generated pieces ahead of prompt ones."""
    if plan.own_decodes:  # one group, each query over exactly its own context
        decodes = [_Piece(p.chunk, q, q + 1) for p in generated for q in range(p.start, p.end)]
        if plan.own_prompts:  # the prompt pieces whole: our kernel tiles them itself
            return ([decodes] if decodes else []), prompt
        return ([decodes] if decodes else []), _prompt_calls(prompt, block_size, plan)
    decodes = [p for p in generated if p.end - p.start == 1]
    longer = [p for p in generated if p.end - p.start > 1] + prompt
    if not plan.own_spans:
        return ([decodes] if decodes else []), _prompt_calls(longer, block_size, plan)
    # No query may attend over a span longer than its own: decodes by span, pieces by block.
    spans: dict[int, list[_Piece]] = {}
    for p in decodes:
        spans.setdefault(-(-p.end // block_size), []).append(p)
    return [spans[n] for n in sorted(spans)], _prompt_calls(longer, block_size, plan)


def _prompt_calls(longer: list[_Piece], block_size: int, plan: AttentionPlan) -> list[_Piece]:
    """Pieces attended in tiles, each cut into the calls it is attended in."""
    if plan.own_spans:
        cut = [(p, block_pieces(p.start, p.end, block_size)) for p in longer]
        return [_Piece(p.chunk, a, b) for p, c in cut for a, b in c]
    # A call reads the keys its last query sees: a long piece in several calls reads less.
    per = plan.tile_tokens * max(1, _CALL_TOKENS // plan.tile_tokens)
    bounds = [(p, range(p.start, p.end, per)) for p in longer]
    return [_Piece(p.chunk, a, min(a + per, p.end)) for p, starts in bounds for a in starts]


def _decode_group(
    batch: list[_Piece], offset: int, block_size: int, device: torch.device, own: bool
) -> tuple[AttnGroup, torch.Tensor]:
    """One query token per element, each over its own table (padded); and the slots written.
    `own`: for our kernel, which reads each context to its end (no mask, int32 tables)."""
    ends = [p.end for p in batch]
    n_blocks = -(-max(ends) // block_size)
    span = n_blocks * block_size
    rows = _tables(batch, n_blocks)
    slots = torch.tensor(
        [row[p.start // block_size] * block_size + p.start % block_size
         for row, p in zip(rows, batch, strict=True)],
        device=device,
    )  # fmt: skip
    group = slice(offset, offset + len(batch))
    if own:
        blocks = torch.tensor(rows, device=device, dtype=torch.int32)
        lengths = torch.tensor(ends, device=device, dtype=torch.int32)
        return AttnGroup(group, len(batch), 1, blocks, None, lengths), slots
    blocks = torch.tensor(rows, device=device)
    mask = None if min(ends) == span else decode_mask(torch.tensor(ends, device=device), span)
    return AttnGroup(group, len(batch), 1, blocks, mask), slots


def _tables(pieces: list[_Piece], n_blocks: int) -> list[list[int]]:
    """Each piece's first n_blocks blocks; a short table padded with block 0, whose positions
    are masked out (or never read)."""
    tables = [p.chunk.block_table[:n_blocks] for p in pieces]
    return [[*t, *([0] * (n_blocks - len(t)))] for t in tables]


def _prompt_group(
    pieces: list[_Piece], positions: torch.Tensor, offset: int, block_size: int,
    device: torch.device,
) -> tuple[AttnGroup, torch.Tensor]:  # fmt: skip
    """Every prompt piece in one group for our kernel (`positions`: its rows'): each row its
    piece's table and its context's end, its own position plus one; and the slots written."""
    n_blocks = max(-(-p.end // block_size) for p in pieces)
    lengths = torch.tensor([p.end - p.start for p in pieces], device=device)
    which = torch.repeat_interleave(torch.arange(len(pieces), device=device), lengths)
    tables = torch.tensor(_tables(pieces, n_blocks), device=device, dtype=torch.int32)
    blocks = tables.index_select(0, which)
    slots = blocks.gather(1, (positions // block_size).unsqueeze(1)).squeeze(1).long()
    slots = slots * block_size + positions % block_size
    ends = (positions + 1).to(torch.int32)
    rows = slice(offset, offset + positions.shape[0])
    return AttnGroup(rows, positions.shape[0], 1, blocks, None, ends, prompts=True), slots


def _tile_group(
    p: _Piece, offset: int, block_size: int, group: int, tile_tokens: int, device: torch.device
) -> tuple[AttnGroup, torch.Tensor]:
    """The piece's queries in tiles of `tile_tokens`, all reading the piece's context; and the
    slots written."""
    table = p.chunk.block_table[: -(-p.end // block_size)]
    mask = tile_mask(p.start, p.end, len(table) * block_size, group, tile_tokens, device)
    blocks = torch.tensor(table, device=device)
    rows = slice(offset, offset + p.end - p.start)
    g = AttnGroup(rows, mask.shape[0], tile_tokens, blocks.unsqueeze(0), mask)  # one shared context
    slots = blocks.unsqueeze(1) * block_size + torch.arange(block_size, device=device)
    return g, slots.view(-1)[p.start : p.end]
