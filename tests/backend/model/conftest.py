"""What the tests of our own kernels share: a bfloat16 model of TINY's shape widened to heads
our attention takes (a multiple of 16 wide), and the mark that skips them where our kernels
are not used."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from backend.model import LoadedModel, native
from backend.model.weights import build_llama
from tests.kit.models import TINY, tiny_tensors

WIDE = replace(TINY, hidden=64, head_dim=32, ffn=96)
needs_our_kernels = pytest.mark.skipif(
    native.unavailable() is not None,
    reason=f"our kernels are not used here: {native.unavailable()}",
)


@pytest.fixture(scope="module")
def wide() -> LoadedModel:
    model = build_llama(WIDE, tiny_tensors(3, WIDE), torch.device("cpu"), torch.bfloat16)
    return LoadedModel(model, WIDE, None, torch.device("cpu"), torch.bfloat16, "wide")  # type: ignore[arg-type]
