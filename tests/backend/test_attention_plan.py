"""The attention plan probed on this host: decodes and prompt tiles give a query the same bits,
and the helpers that cut queries by block."""

from __future__ import annotations

import pytest
import torch

from backend.model.attend import attend, block_pieces, decode_mask, tile_mask
from backend.model.attention_plan import plan_attention
from backend.model.config import ModelConfig
from tests.kit.models import TEST_DEVICE, TINY

# SmolLM2-135M's attention: 9 query heads over 3 KV heads of 64.
SMOLLM2 = ModelConfig(30, 576, 9, 3, 64, 1536, 49152, 1e5, 1e-5, True, 8192, 1, (2,))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("config", [TINY, SMOLLM2], ids=["tiny", "smollm2"])
def test_this_host_keeps_a_querys_bits_in_any_batch(
    dtype: torch.dtype, config: ModelConfig
) -> None:
    plan = plan_attention(config, 16, dtype, TEST_DEVICE)
    assert plan.invariant, plan.describe()
    assert plan.tile_tokens * config.group <= 32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_copies_of_a_decode_get_its_bits_whichever_thread_runs_them(dtype: torch.dtype) -> None:
    plan = plan_attention(SMOLLM2, 16, dtype, TEST_DEVICE)
    gen = torch.Generator().manual_seed(1)
    c = SMOLLM2
    q = torch.randn(1, c.n_kv_heads, c.group, c.head_dim, generator=gen).to(TEST_DEVICE, dtype)
    k, v = torch.randn(2, 1, c.n_kv_heads, 48, c.head_dim, generator=gen).to(TEST_DEVICE, dtype)
    alone = attend(
        q, k, v, 1, 1, decode_mask(torch.tensor([40], device=TEST_DEVICE), 48), plan.row_multiple
    )
    for n in (2, 3, 8, 17):
        ends = torch.full((n,), 40, device=TEST_DEVICE)
        kn, vn = (t.expand(n, -1, -1, -1).contiguous() for t in (k, v))
        got = attend(
            q.expand(n, -1, -1, -1), kn, vn, n, 1, decode_mask(ends, 48), plan.row_multiple
        )
        assert all(torch.equal(row, alone[0]) for row in got), (n, plan.describe())


@pytest.mark.parametrize("multiple", [2, 4, 8])
def test_padded_query_rows_change_no_querys_result(multiple: int) -> None:
    gen = torch.Generator().manual_seed(2)
    c = SMOLLM2
    q = torch.randn(13, c.n_kv_heads, c.group, c.head_dim, generator=gen)
    k, v = torch.randn(2, 1, c.n_kv_heads, 32, c.head_dim, generator=gen)
    mask = tile_mask(3, 16, 32, c.group, 5, torch.device("cpu"))
    plain = attend(q, k, v, mask.shape[0], 5, mask)
    padded = attend(q, k, v, mask.shape[0], 5, mask, multiple)
    torch.testing.assert_close(padded, plain)


@pytest.mark.parametrize(
    ("start", "end", "pieces"),
    [
        (0, 16, [(0, 16)]),
        (5, 40, [(5, 16), (16, 32), (32, 40)]),
        (16, 17, [(16, 17)]),
        (15, 16, [(15, 16)]),
        (3, 9, [(3, 9)]),
    ],
)
def test_block_pieces_cut_at_block_ends(
    start: int, end: int, pieces: list[tuple[int, int]]
) -> None:
    assert block_pieces(start, end, 16) == pieces
