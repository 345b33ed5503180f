"""How a step's chunks are packed: generated tokens ahead of prompt tokens, a chunk cut at its
prompt's end, decodes batched (by span where the plan asks), other pieces in query tiles."""

from __future__ import annotations

import torch

from backend.engine.plan import Chunk, SamplingParams
from backend.model.attention_plan import AttentionPlan
from backend.model.step_inputs import build_step_inputs

BS = 4
CPU = torch.device("cpu")
GREEDY = SamplingParams(temperature=0.0)


def chunk(seq: int, start: int, n: int, prompt_len: int, sample: bool = True) -> Chunk:
    table = tuple(range(seq * 10, seq * 10 + 10))
    return Chunk(seq, tuple(range(100 * seq + start, 100 * seq + start + n)), start, table,
                 sample, GREEDY, 0, prompt_len)  # fmt: skip


def test_generated_tokens_come_first_and_a_recomputed_chunk_is_cut_at_its_prompt() -> None:
    chunks = [
        chunk(1, 0, 6, prompt_len=6),  # a prompt
        chunk(2, 9, 1, prompt_len=5),  # a decode
        chunk(3, 0, 9, prompt_len=6),  # computed again: 6 prompt tokens, 3 generated ones
        chunk(4, 7, 1, prompt_len=8, sample=False),  # the prompt's last token, alone
    ]
    plan = AttentionPlan(tile_tokens=2, own_spans=False, invariant=True)
    inputs = build_step_inputs(chunks, BS, 2, plan, CPU)
    assert inputs.generated == 1 + 3
    prompts = [*range(100, 106), *range(300, 306), 407]
    assert inputs.input_ids.tolist() == [209, 306, 307, 308, *prompts]
    assert inputs.positions.tolist() == [9, 6, 7, 8, *range(6), *range(6), 7]
    assert [(g.rows.start, g.rows.stop, g.batch, g.span) for g in inputs.groups] == [
        (0, 1, 1, 1),  # the decode
        (1, 4, 2, 2),  # the generated tail: two tiles of two tokens
        (4, 10, 3, 2),
        (10, 16, 3, 2),
        (16, 17, 1, 2),
    ]
    # Sampled rows: each chunk's last token, in row order.
    assert inputs.logits_index.tolist() == [0, 3, 9]
    assert [c.seq_id for c in inputs.sampled] == [2, 3, 1]


def test_tiles_are_causal_and_padded_with_their_last_query() -> None:
    plan = AttentionPlan(tile_tokens=2, own_spans=False, invariant=True)
    inputs = build_step_inputs([chunk(1, 2, 3, prompt_len=5)], BS, 2, plan, CPU)
    [g] = inputs.groups
    assert g.mask is not None and g.mask.shape == (2, 1, 4, 8)  # 2 tiles, 2 heads x 2 tokens
    seen = g.mask[:, 0].sum(-1).tolist()  # keys each query row sees, rows (head, token)
    assert seen == [[3, 4, 3, 4], [5, 5, 5, 5]]


def test_own_spans_keep_every_query_within_its_block() -> None:
    chunks = [chunk(1, 3, 1, 3), chunk(2, 9, 1, 5), chunk(3, 10, 1, 5), chunk(4, 2, 7, 9)]
    plan = AttentionPlan(tile_tokens=2, own_spans=True, invariant=True)
    inputs = build_step_inputs(chunks, BS, 2, plan, CPU)
    spans = [(g.rows.stop - g.rows.start, g.mask.shape[-1] if g.mask is not None else None)
             for g in inputs.groups]  # fmt: skip
    # Decodes by span (4: seq 1; 12: seqs 2 and 3), then the prompt cut at 4 and 8.
    assert spans == [(1, None), (2, 12), (2, 4), (4, 8), (1, 12)]
    assert inputs.positions.tolist() == [3, 9, 10, *range(2, 9)]


def test_a_long_prompt_attends_in_calls_that_read_only_the_keys_they_see() -> None:
    plan = AttentionPlan(tile_tokens=10, own_spans=False, invariant=True)
    long = Chunk(1, tuple(range(200)), 0, tuple(range(50)), True, GREEDY, 0, 200)
    inputs = build_step_inputs([long], BS, 2, plan, CPU)
    calls = [(g.rows.start, g.rows.stop, g.mask.shape[-1] if g.mask is not None else 0)
             for g in inputs.groups]  # fmt: skip
    assert calls == [(0, 90, 92), (90, 180, 180), (180, 200, 200)]


def test_under_our_decode_kernel_every_generated_token_is_a_decode_over_its_own_context() -> None:
    chunks = [
        chunk(1, 0, 6, prompt_len=6),  # a prompt
        chunk(2, 9, 1, prompt_len=5),  # a decode
        chunk(3, 0, 9, prompt_len=6),  # computed again: 6 prompt tokens, 3 generated ones
    ]
    plan = AttentionPlan(tile_tokens=2, own_spans=True, invariant=True, own_decodes=True)
    inputs = build_step_inputs(chunks, BS, 2, plan, CPU)
    assert inputs.generated == 4
    decodes, *tiles = inputs.groups
    assert (decodes.rows.start, decodes.rows.stop, decodes.batch, decodes.span) == (0, 4, 4, 1)
    assert decodes.mask is None and decodes.ends is not None
    assert decodes.ends.tolist() == [10, 7, 8, 9]  # each token attends up to itself, no further
    assert decodes.blocks.dtype == torch.int32 and decodes.ends.dtype == torch.int32
    assert decodes.blocks[:, :2].tolist() == [[20, 21], [30, 31], [30, 31], [30, 31]]
    assert inputs.slots[:4].tolist() == [22 * BS + 1, 31 * BS + 2, 31 * BS + 3, 32 * BS]
    assert all(g.ends is None for g in tiles)  # prompt tokens keep the probed tiles
    assert inputs.positions.tolist() == [9, 6, 7, 8, *range(6), *range(6)]


def test_under_our_prompt_kernel_every_prompt_token_is_one_group_each_row_its_own_context() -> None:
    chunks = [
        chunk(1, 0, 6, prompt_len=6),  # a prompt
        chunk(2, 9, 1, prompt_len=5),  # a decode
        chunk(3, 3, 6, prompt_len=6),  # a prompt's second chunk, then 3 generated tokens
    ]
    plan = AttentionPlan(1, True, True, own_decodes=True, own_prompts=True)
    inputs = build_step_inputs(chunks, BS, 2, plan, CPU)
    decodes, prompts = inputs.groups
    assert (decodes.rows.start, decodes.rows.stop) == (0, 4) and not decodes.prompts
    assert (prompts.rows.start, prompts.rows.stop, prompts.batch) == (4, 13, 9)
    assert prompts.prompts and prompts.mask is None and prompts.ends is not None
    assert prompts.ends.tolist() == [*range(1, 7), 4, 5, 6]  # each row up to itself
    assert prompts.blocks.dtype == torch.int32 and prompts.ends.dtype == torch.int32
    assert prompts.blocks[:, :2].tolist() == [[10, 11]] * 6 + [[30, 31]] * 3
    slots = [*range(10 * BS, 10 * BS + 6), 30 * BS + 3, 31 * BS, 31 * BS + 1]
    assert inputs.slots[4:].tolist() == slots
    assert inputs.positions.tolist() == [9, 6, 7, 8, *range(6), 3, 4, 5]
