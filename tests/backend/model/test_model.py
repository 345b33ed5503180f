"""The decoder's arithmetic: causality, row selection, and the real model's reference answer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from backend.model import LoadedModel
from backend.model.activation import SwiGLU
from backend.model.linear import Projection
from backend.model.llama import DenseCausalAttention
from tests.kit.models import TEST_DEVICE


def test_earlier_logits_ignore_later_tokens(tiny_model: LoadedModel) -> None:
    a = [5, 17, 99, 3, 42, 8]
    b = [5, 17, 99, 3, 200, 201]
    with torch.inference_mode():
        la = tiny_model.model.forward_dense(a)
        lb = tiny_model.model.forward_dense(b)
    torch.testing.assert_close(la[:4], lb[:4])
    assert not torch.allclose(la[4:], lb[4:])


def test_logits_index_projects_only_the_chosen_rows(tiny_model: LoadedModel) -> None:
    dev = tiny_model.device
    ids = torch.tensor([1, 2, 3, 4, 5], device=dev)
    model = tiny_model.model
    attention = DenseCausalAttention(tiny_model.config.group)
    with torch.inference_mode():
        full = model.forward(ids, torch.arange(5, device=dev), attention)
        rows = torch.tensor([4, 1], device=dev)
        some = model.forward(ids, torch.arange(5, device=dev), attention, rows)
    assert some.shape == (2, tiny_model.config.vocab)
    torch.testing.assert_close(some, full[[4, 1]])


def test_positions_matter(tiny_model: LoadedModel) -> None:
    """Rotary embeddings make the same tokens at shifted positions attend differently."""
    dev = tiny_model.device
    ids = torch.tensor([7, 8, 9], device=dev)
    attention = DenseCausalAttention(tiny_model.config.group)
    with torch.inference_mode():
        at_zero = tiny_model.model.forward(ids, torch.arange(3, device=dev), attention)
        shifted = tiny_model.model.forward(ids, torch.arange(3, device=dev) + 40, attention)
    # Relative positions are equal, so rotary attention scores (and logits) agree...
    torch.testing.assert_close(at_zero, shifted, rtol=1e-4, atol=1e-4)
    with torch.inference_mode():
        spread = tiny_model.model.forward(ids, torch.tensor([0, 10, 20], device=dev), attention)
    # ...while different gaps change them.
    assert not torch.allclose(at_zero[1:], spread[1:], atol=1e-3)


@pytest.mark.slow
def test_dense_forward_gives_the_reference_answer(smollm2: LoadedModel) -> None:
    tok = smollm2.tokenizer
    text = tok.render_chat([{"role": "user", "content": "What is the capital of France?"}])
    ids = tok.encode(text)
    with torch.inference_mode():
        for _ in range(8):
            ids.append(int(smollm2.model.forward_dense(ids)[-1].argmax()))
    assert tok.decode(ids[-8:]).startswith("The capital of France is Paris.")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_swiglu_rows_do_not_depend_on_how_many_share_the_call(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(2)
    swiglu = SwiGLU(1536, dtype, TEST_DEVICE)
    x = torch.randn(300, 2 * 1536, generator=gen).to(device=TEST_DEVICE, dtype=dtype)
    alone = torch.cat([swiglu(x[i : i + 1]) for i in range(300)])
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(alone, F.silu(gate) * up)
    for rows in (2, 21, 22, 64, 65, 150, 300):
        assert torch.equal(swiglu(x[:rows]), alone[:rows]), rows


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(96, 160), (576, 1536)])
def test_projection_rows_do_not_depend_on_batch_mates(
    dtype: torch.dtype, shape: tuple[int, int]
) -> None:
    """Whatever layout a weight is kept in and however this host's kernel blocks its rows, a
    generated row gets the bits it gets alone in a decode batch of any size, and a prompt row
    the same bits in a prompt chunk of any size (batched == one at a time rests on this)."""
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(*shape, generator=gen).to(dtype)
    x = torch.randn(300, shape[1], generator=gen).to(dtype)
    proj = Projection(weight)
    alone = torch.cat([proj(x[i : i + 1], 1) for i in range(70)])
    for rows in range(2, 71):
        assert torch.equal(proj(x[:rows], rows), alone[:rows]), rows
    prompt = proj(x, 0)
    torch.testing.assert_close(prompt, F.linear(x, weight), rtol=1e-2, atol=1e-2)
    for start, rows in ((0, 1), (3, 5), (0, 47), (10, 48), (7, 100), (40, 260)):
        assert torch.equal(proj(x[start : start + rows], 0), prompt[start : start + rows])
    mixed = proj(torch.cat((x[:40], x[100:140])), 40)
    assert torch.equal(mixed, torch.cat((alone[:40], prompt[100:140])))
