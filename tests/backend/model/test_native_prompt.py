"""Our own kernel for a step's prompt rows: attention read in place from the pool agrees with
float32 for several query-head groupings, gives a query the same bits in any chunk, beside any
other prompt and on any thread count, and refuses what it cannot attend; a bfloat16 model's
prompt leaves the same bits in the pool however it is chunked, and answers like the probed tiles
of torch's attention. Skipped where our kernels are not used (no AVX-512 BF16 or no compiler)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

import pytest
import torch

from backend.engine.plan import Chunk, SamplingParams, StepPlan, StepResult
from backend.model import LoadedModel, native
from backend.model.attention_plan import plan_attention
from backend.model.native_decode import PromptAttention
from backend.runner import ModelRunner
from tests.backend.model.conftest import WIDE, needs_our_kernels

pytestmark = needs_our_kernels

BS = 4
LOGPROBS = SamplingParams(max_tokens=64, temperature=0.0, logprobs=3)


def _case(
    lengths: Sequence[int], heads: int, kv_heads: int, d: int, blocks: int = 64, seed: int = 0
) -> tuple[torch.Tensor, ...]:
    """Prompts of `lengths` tokens, each row over its own prompt's scattered table up to itself:
    (q, k, v, tables, ends) with k, v a one-layer pool."""
    gen = torch.Generator().manual_seed(seed)
    k, v = torch.randn(2, 1, blocks, BS, kv_heads, d, generator=gen).to(torch.bfloat16)
    rows = sum(lengths)
    q = torch.randn(rows, heads, d, generator=gen).to(torch.bfloat16)
    nb = -(-max(lengths) // BS)
    order = torch.randperm(blocks, generator=gen)
    tables, ends, used = [], [], 0
    for n in lengths:
        table = order[used : used + nb]
        used += nb
        tables += [table] * n
        ends += list(range(1, n + 1))
    return q, k, v, torch.stack(tables), torch.tensor(ends)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tables: torch.Tensor,
            ends: torch.Tensor, rows: slice | None = None) -> torch.Tensor:  # fmt: skip
    rows = rows or slice(0, q.shape[0])
    slots = torch.zeros(q[rows].shape[0], dtype=torch.long)
    own = PromptAttention(tables[rows], ends[rows], slots, k, v, heads=q.shape[1])
    return own(0, q[rows])


@pytest.mark.parametrize(
    ("heads", "kv_heads", "d"),
    [(9, 3, 64), (6, 2, 32), (4, 4, 16), (16, 2, 128), (48, 1, 32)],
    ids=["smollm2", "three-per-kv", "no-sharing", "eight-per-kv-128-wide", "a-whole-tile"],
)
def test_prompt_attention_agrees_with_float32(heads: int, kv_heads: int, d: int) -> None:
    q, k, v, tables, ends = _case([37, 1, 5, 20], heads, kv_heads, d)
    ref = native.reference_attention(q, k[0].flatten(0, 1), v[0].flatten(0, 1), tables, ends, BS)
    torch.testing.assert_close(_attend(q, k, v, tables, ends).float(), ref, rtol=1e-2, atol=1e-2)


def test_a_prompt_query_gets_the_same_bits_in_any_chunk_beside_anything_on_any_threads() -> None:
    q, k, v, tables, ends = _case([70, 9, 33], 9, 3, 64)
    whole = _attend(q, k, v, tables, ends)
    alone = torch.cat([_attend(q, k, v, tables, ends, slice(i, i + 1)) for i in range(len(q))])
    assert torch.equal(whole, alone)
    threads = torch.get_num_threads()
    try:
        for count in sorted({1, 2, threads}):
            torch.set_num_threads(count)
            for cuts in ([5], [16, 17, 70], [1, 47, 79, 80, 100]):
                bounds = [0, *cuts, len(q)]
                parts = [_attend(q, k, v, tables, ends, slice(a, b))
                         for a, b in itertools.pairwise(bounds)]  # fmt: skip
                assert torch.equal(torch.cat(parts), whole), (count, cuts)
    finally:
        torch.set_num_threads(threads)


def test_more_query_heads_per_kv_head_than_a_tile_holds_are_refused() -> None:
    q, k, v, tables, ends = _case([3], 2 * (native.PROMPT_GROUP_MAX + 1), 2, 16)
    with pytest.raises(ValueError, match="at most"):
        _attend(q, k, v, tables, ends)


def test_a_prompt_row_past_its_table_is_refused() -> None:
    q, k, v, tables, ends = _case([8], 6, 2, 32)
    with pytest.raises(ValueError, match="pool"):
        _attend(q, k, v, tables, ends + tables.shape[1] * BS)


def test_a_bfloat16_host_plans_our_kernels_for_every_query() -> None:
    plan = plan_attention(WIDE, BS, torch.bfloat16, torch.device("cpu"))
    assert plan.own_decodes and plan.own_prompts
    assert "our kernels for decodes and prompts" in plan.describe()
    assert not plan_attention(WIDE, BS, torch.float32, torch.device("cpu")).own_prompts


PROMPT = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28, 84, 19]
OTHER = [7, 7, 7, 9, 1, 4, 4, 80, 2]


def prefilled(
    loaded: LoadedModel, cuts: Sequence[int], beside: bool = False, tiles: bool = False
) -> tuple[StepResult, torch.Tensor]:
    """PROMPT prefilled in chunks ending at `cuts` (with `beside`, each chunk shares its step
    with a chunk of OTHER), then one decode: its result and PROMPT's K/V in the pool."""
    runner = ModelRunner(loaded, num_blocks=16, block_size=BS)
    if tiles:
        runner.pool.plan = replace(runner.pool.plan, own_prompts=False)
    table, n = tuple(range(8)), len(PROMPT)
    bounds = [0, *cuts, n]
    first: dict[int, int] = {}
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        chunks = [Chunk(0, tuple(PROMPT[a:b]), a, table, b == n, LOGPROBS, 0, n)]
        if beside and i < len(OTHER):
            o = OTHER[: i + 1]
            chunks.append(Chunk(1, (o[-1],), i, tuple(range(8, 16)), False, LOGPROBS, 0, 9))
        first = runner.execute(StepPlan(tuple(chunks))).tokens
    decode = Chunk(0, (first[0],), n, table, True, LOGPROBS, 1, n)
    kv = torch.cat((runner.pool.k[:, :5], runner.pool.v[:, :5]))
    return runner.execute(StepPlan((decode,))), kv


@pytest.mark.parametrize("cuts", [[1], [5, 6], [3, 8, 13], [4, 8, 12, 16], list(range(1, 20))])
def test_a_bfloat16_prompt_leaves_the_same_bits_however_it_is_chunked(
    wide: LoadedModel, cuts: list[int]
) -> None:
    assert ModelRunner(wide, num_blocks=4, block_size=BS).pool.plan.own_prompts
    whole_result, whole_kv = prefilled(wide, [])
    for beside in (False, True):
        result, kv = prefilled(wide, cuts, beside)
        assert torch.equal(kv, whole_kv), beside
        assert result == whole_result, beside


def test_our_prompt_kernel_answers_like_the_probed_tiles(wide: LoadedModel) -> None:
    ours, _ = prefilled(wide, [7, 13])
    theirs, _ = prefilled(wide, [7, 13], tiles=True)
    assert ours.logprobs is not None and theirs.logprobs is not None
    top_a, top_b = dict(ours.logprobs[0].top), dict(theirs.logprobs[0].top)
    shared = top_a.keys() & top_b.keys()
    assert shared
    for t in shared:
        assert top_a[t] == pytest.approx(top_b[t], abs=0.1)
