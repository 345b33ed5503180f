"""Our own kernels for a step's generated rows: decode attention read in place from the pool
agrees with float32 and gives a query the same bits alone, in any batch and on any thread count;
tables that would read outside the pool are refused before any call; and whole decoder layers
for generated rows answer like the torch layers, keep a row's bits alone, batched and beside a
prompt, and are what a bfloat16 model uses where every projection is ours. The kernels need a
CPU with AVX-512 BF16 (and a C compiler); elsewhere these tests are skipped, and the model runs
every row as before."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from backend.engine.plan import Chunk, SamplingParams, StepPlan
from backend.model import LoadedModel, native
from backend.model.native_decode import DecodeAttention
from backend.runner import ModelRunner
from tests.backend.model.conftest import needs_our_kernels

pytestmark = needs_our_kernels

BS = 4
LOGPROBS = SamplingParams(max_tokens=64, temperature=0.0, logprobs=3)


def _pool(blocks: int, layers: int = 1, kv_heads: int = 2, d: int = 32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    shape = (layers, blocks, BS, kv_heads, d)
    return tuple(torch.randn(shape, generator=gen).to(torch.bfloat16) for _ in range(2))


def _queries(b: int, heads: int = 6, d: int = 32, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(b, heads, d, generator=gen).to(torch.bfloat16)


def _tables(b: int, nb: int, blocks: int, seed: int = 2) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(blocks, generator=gen)[:nb] for _ in range(b)])


def test_decode_attention_agrees_with_float32() -> None:
    k, v = _pool(24)
    tables = _tables(5, 6, 24)
    ends = torch.tensor([1, 3, 4, 17, 24])  # one position, a part block, a whole table
    q = _queries(5)
    own = DecodeAttention(tables, ends, torch.zeros(5, dtype=torch.long), k, v, heads=6)
    ref = native.reference_attention(q, k[0].flatten(0, 1), v[0].flatten(0, 1), tables, ends, BS)
    torch.testing.assert_close(own(0, q).float(), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "d"),
    [(9, 3, 64), (9, 1, 64), (7, 1, 32), (6, 2, 128), (4, 2, 256), (16, 1, 16)],
)
def test_every_head_grouping_and_width_agrees_with_float32(
    heads: int, kv_heads: int, d: int
) -> None:
    """The query heads of a KV head are attended in groups (up to four, fewer for wide heads):
    SmolLM2's 9 over 3, groups with a remainder, widths of 16 to 256."""
    k, v = _pool(24, kv_heads=kv_heads, d=d, seed=d)
    tables, ends = _tables(4, 6, 24), torch.tensor([1, 17, 24, 9])
    q = _queries(4, heads=heads, d=d, seed=heads)
    own = DecodeAttention(tables, ends, torch.zeros(4, dtype=torch.long), k, v, heads=heads)
    ref = native.reference_attention(q, k[0].flatten(0, 1), v[0].flatten(0, 1), tables, ends, BS)
    torch.testing.assert_close(own(0, q).float(), ref, rtol=1e-2, atol=1e-2)


def test_a_nan_in_a_key_is_not_hidden() -> None:
    """A NaN score makes its query's result NaN, as in float32; other rows keep their values."""
    k, v = _pool(24)
    tables, ends = _tables(2, 6, 24), torch.tensor([9, 9])
    k[0, tables[0, 0], 1, 0, 0] = float("nan")  # row 0's position 1, KV head 0
    q = _queries(2)
    out = DecodeAttention(tables, ends, torch.zeros(2, dtype=torch.long), k, v, heads=6)(0, q)
    heads = out.view(2, 6, 32)
    assert heads[0, :3].isnan().all()  # the three query heads of KV head 0
    assert not heads[0, 3:].isnan().any() and not heads[1].isnan().any()


def test_a_query_gets_the_same_bits_in_any_group_of_heads() -> None:
    """Nine query heads over one KV head go in groups of 4, 4 and 1; each head alone (one query
    head over that KV head) gets the same bits as in its group."""
    k, v = _pool(24, kv_heads=1, d=64)
    tables, ends = _tables(3, 6, 24), torch.tensor([5, 24, 13])
    q = _queries(3, heads=9, d=64)
    slots = torch.zeros(3, dtype=torch.long)
    together = DecodeAttention(tables, ends, slots, k, v, heads=9)(0, q).view(3, 9, 64)
    for head in range(9):
        alone = DecodeAttention(tables, ends, slots, k, v, heads=1)(0, q[:, head : head + 1])
        assert torch.equal(alone.view(3, 64), together[:, head]), head


def test_a_query_gets_the_same_bits_alone_in_any_batch_and_on_any_thread_count() -> None:
    k, v = _pool(40)
    b = 9
    tables, ends, q = _tables(b, 10, 40), torch.tensor([1, 40, 7, 8, 9, 33, 2, 16, 21]), _queries(b)
    slots = torch.zeros(b, dtype=torch.long)

    def attend(rows: slice) -> torch.Tensor:
        return DecodeAttention(tables[rows], ends[rows], slots[rows], k, v, heads=6)(0, q[rows])

    alone = torch.cat([attend(slice(i, i + 1)) for i in range(b)])
    threads = torch.get_num_threads()
    try:
        for count in sorted({1, 2, threads}):
            torch.set_num_threads(count)
            for m in range(1, b + 1):
                assert torch.equal(attend(slice(0, m)), alone[:m]), (count, m)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize(
    ("ends", "table", "slot"),
    [
        ([13], [0, 1, 2], 0),  # the context runs past its table (3 blocks of 4)
        ([0], [0, 1, 2], 0),  # a query with nothing to attend
        ([4], [0, 1, 8], 0),  # a block past the pool's 8
        ([4], [-1, 1, 2], 0),  # a negative block id
        ([4], [0, 1, 2], 32),  # a slot past the pool
    ],
)
def test_a_table_or_slot_outside_the_pool_is_refused(
    ends: list[int], table: list[int], slot: int
) -> None:
    k, v = _pool(8)
    with pytest.raises(ValueError, match="pool"):
        DecodeAttention(torch.tensor([table]), torch.tensor(ends), torch.tensor([slot]), k, v, 6)


PROMPTS = [[3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46], [2, 71, 82, 81], [7, 7, 7, 9, 1]]


def _prefill(seq: int, ids: list[int]) -> Chunk:
    table = tuple(range(seq * 16, seq * 16 + 16))
    return Chunk(seq, tuple(ids), 0, table, True, LOGPROBS, 0, len(ids))


def _decode(seq: int, token: int, prompt: list[int], done: int) -> Chunk:
    table = tuple(range(seq * 16, seq * 16 + 16))
    return Chunk(seq, (token,), len(prompt) + done - 1, table, True, LOGPROBS, done, len(prompt))


def test_a_bfloat16_model_runs_generated_rows_in_our_layers(
    wide: LoadedModel, tiny_model: LoadedModel
) -> None:
    assert wide.model._own is not None
    assert "generated rows: whole layers in our kernels" in wide.model.row_plans()
    assert tiny_model.model._own is None  # float32 (and head_dim 8): the torch layers


def test_our_layers_answer_like_the_torch_layers(wide: LoadedModel) -> None:
    """The same bfloat16 weights, decodes through our layers and through torch's: each decode's
    log-probabilities agree to bfloat16's rounding."""
    runs = []
    for own in (True, False):
        runner = ModelRunner(wide, num_blocks=64, block_size=BS)
        if not own:
            runner.pool.plan = replace(runner.pool.plan, own_decodes=False)
        first = runner.execute(StepPlan((_prefill(0, PROMPTS[0]),)))
        tokens, results = [first.tokens[0]], []
        for done in range(1, 9):  # the same tokens in both runs: the first run's
            token = runs[0][0][done - 1] if runs else tokens[-1]
            result = runner.execute(StepPlan((_decode(0, token, PROMPTS[0], done),)))
            tokens.append(result.tokens[0])
            results.append(result.logprobs[0])
        runs.append((tokens, results))
    (_, ours_lp), (_, theirs_lp) = runs
    for a, b in zip(ours_lp, theirs_lp, strict=True):
        top_a, top_b = dict(a.top), dict(b.top)
        shared = top_a.keys() & top_b.keys()
        assert shared  # the most likely tokens are the same candidates
        for t in shared:
            assert top_a[t] == pytest.approx(top_b[t], abs=0.1)


def test_a_decode_gets_the_same_bits_alone_batched_and_beside_a_prompt(wide: LoadedModel) -> None:
    def first_decodes(others: bool) -> list[object]:
        runner = ModelRunner(wide, num_blocks=64, block_size=BS)
        token = runner.execute(StepPlan((_prefill(0, PROMPTS[0]),))).tokens[0]
        if others:
            t1 = runner.execute(StepPlan((_prefill(1, PROMPTS[1]),))).tokens[1]
        out = []
        for done in range(1, 5):
            chunks = [_decode(0, token, PROMPTS[0], done)]
            if others and done == 1:  # beside a decode and a prompt's second chunk
                head = Chunk(
                    2, tuple(PROMPTS[2][:3]), 0, tuple(range(32, 48)), False, LOGPROBS, 0, 5
                )
                chunks += [_decode(1, t1, PROMPTS[1], 1), head]
            result = runner.execute(StepPlan(tuple(chunks)))
            token = result.tokens[0]
            out.append((token, result.logprobs[0]))
        return out

    assert first_decodes(others=True) == first_decodes(others=False)
