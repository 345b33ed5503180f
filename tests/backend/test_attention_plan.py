"""The attention plan probed on this host: decodes and prompt tiles give a query the same bits,
and the helpers that cut queries by block."""

from __future__ import annotations

import pytest
import torch

from backend.model.attend import block_pieces
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
