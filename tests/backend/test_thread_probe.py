"""The start-up probe that lets the engine change its thread count: it says yes only where every
count gives the same bits, and leaves the thread count and the pool as it found them."""

from __future__ import annotations

import pytest
import torch

from backend.model import LoadedModel
from backend.model.kv_pool import AttnGroup
from backend.model.llama import Attention
from backend.model.native_decode import DecodeAttention
from backend.runner import ModelRunner
from backend.thread_probe import agree, thread_counts


def test_counts_halve_down_to_one() -> None:
    assert thread_counts(1) == (1,)
    assert thread_counts(2) == (2, 1)
    assert thread_counts(6) == (6, 3, 1)
    assert thread_counts(16) == (16, 8, 4, 2, 1)


@pytest.fixture
def runner(tiny_model: LoadedModel) -> ModelRunner:
    return ModelRunner(tiny_model, num_blocks=64, block_size=4)


def test_a_count_agrees_with_itself(runner: ModelRunner) -> None:
    """The probe's own runs are deterministic: no false alarm from the probe itself."""
    assert agree(runner, (2, 2))
    assert agree(runner, (1, 1))


@pytest.mark.parametrize("counts", [(2, 1), (2, 2)])
def test_the_probe_leaves_no_trace(runner: ModelRunner, counts: tuple[int, int]) -> None:
    """Whatever this host's kernels answer, the thread count and the pool are as they were."""
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # neither count the probe runs at
    try:
        agree(runner, counts)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
    assert not runner.pool.k.any() and not runner.pool.v.any()


def test_a_kernel_whose_bits_follow_the_thread_count_is_caught(
    runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    proj = runner.model.projections()["down"]
    kernel = proj._kernel

    def drifting(x: torch.Tensor) -> torch.Tensor:
        out = kernel(x)
        return out + 1e-3 if torch.get_num_threads() == 1 else out

    monkeypatch.setattr(proj, "_kernel", drifting)
    assert not agree(runner, (2, 1))
    assert agree(runner, (2, 2))  # the same drift at one count is no drift


def test_a_step_that_follows_the_thread_count_is_caught(
    runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attention is not a projection: only the paged steps can see it drift."""
    attention = runner.pool.attention

    class Drifting:
        decodes: DecodeAttention | None = None  # every row through `__call__`, ours too

        def __init__(self, slots: torch.Tensor, groups: list[AttnGroup]) -> None:
            self.paged = attention(slots, groups)

        def __call__(
            self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
        ) -> torch.Tensor:
            out = self.paged(layer, q, k, v)
            return out * 1.01 if torch.get_num_threads() == 1 else out

        prompt = __call__

    def drifting(slots: torch.Tensor, groups: list[AttnGroup]) -> Attention:
        return Drifting(slots, groups)

    monkeypatch.setattr(runner.pool, "attention", drifting)
    assert not agree(runner, (2, 1))
