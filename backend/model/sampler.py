"""Chooses the next token from logits: greedy at temperature 0, else temperature and top-p.

Invariant: with a seed, the token drawn depends only on (seed, num_generated) and the row's
logits, never on which other sequences share the batch. A step reads its tokens back to the
host once, whatever its rows ask (`tolist` at the end): no row reads a scalar back on its own,
so on a GPU no row waits for the device. A draw is one uniform number per row against the row's
cumulative distribution (torch.multinomial draws an exponential per token: 8 ms a step for 8 rows
of a 49,152-token vocabulary on a CPU, where this takes 0.2 ms).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

import torch

from backend.engine.plan import SamplingParams

# The lowest temperature the logits are divided by. The API takes any temperature up to 2, and
# below about 1e-37 the quotient overflows float32 (inf, then NaN, which no draw survives: the
# step would fail, and every sequence in it). At 1e-6 the softmax already puts all its mass on
# the argmax, bar logits within a few millionths of it, so a lower temperature draws as 1e-6.
MIN_TEMPERATURE: Final = 1e-6


def seeded_generator(seed: int, num_generated: int, device: torch.device) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}:{num_generated}".encode()).digest()
    gen = torch.Generator(device=device)
    gen.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return gen


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    num_generated: Sequence[int],
    generator: torch.Generator,
) -> list[int]:
    """logits: [N, V] fp32 -> N token ids. `generator` serves rows without a seed, all of them
    in one draw (their tokens follow the generator and the batch, as an unseeded draw may)."""
    greedy = logits.argmax(dim=-1)  # [N]
    if all(p.temperature <= 0 for p in params):
        return [int(t) for t in greedy.tolist()]
    tokens = greedy.clone()
    shared = [i for i, p in enumerate(params) if p.temperature > 0 and p.seed is None]
    if shared:
        device = logits.device
        rows = torch.tensor(shared, device=device)
        settings = torch.tensor(
            [(_temperature(params[i]), params[i].top_p) for i in shared], device=device
        )  # [R, 2]: each row's temperature and top-p, one copy to the device
        nucleus = any(params[i].top_p < 1.0 for i in shared)
        drawn = _draw_rows(logits.index_select(0, rows), settings, nucleus, generator)
        tokens.index_copy_(0, rows, drawn)
    for i, p in enumerate(params):
        if p.temperature > 0 and p.seed is not None:
            gen = seeded_generator(p.seed, num_generated[i], logits.device)
            tokens[i] = _draw(logits[i], _temperature(p), p.top_p, gen)
    return [int(t) for t in tokens.tolist()]


def _temperature(p: SamplingParams) -> float:
    return max(p.temperature, MIN_TEMPERATURE)


def _draw(
    logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator
) -> torch.Tensor:
    """logits: [V] -> a 1-element token id tensor (never read back here)."""
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        drop = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        choice = _categorical(sorted_probs.unsqueeze(0), gen)
        return order.index_select(0, choice)
    return _categorical(probs.unsqueeze(0), gen)


def _draw_rows(
    logits: torch.Tensor, settings: torch.Tensor, nucleus: bool, gen: torch.Generator
) -> torch.Tensor:
    """logits: [R, V], settings: [R, 2] (temperature, top-p) -> [R] token ids, every row in
    the same few kernels. A row whose top-p is 1 keeps its whole distribution; `nucleus`: some
    row's top-p is below 1 (else nothing is sorted)."""
    probs = torch.softmax(logits / settings[:, :1], dim=-1)
    if not nucleus:
        return _categorical(probs, gen)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    top_p = settings[:, 1:]
    # As `_draw`: the smallest head whose mass reaches top-p; nothing dropped at a top-p of 1.
    drop = (sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p) & (top_p < 1.0)
    choice = _categorical(sorted_probs.masked_fill(drop, 0.0), gen)  # [R]
    return order.gather(1, choice.unsqueeze(1)).squeeze(1)


def _categorical(weights: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """weights: [R, V], non-negative, some mass in each row -> [R] indices, each drawn with
    probability weight / row total: one uniform per row, found in the row's running sum. The
    uniform stays below the total, so the index is in range, and an index of weight 0 is never
    drawn (its running sum equals the one before it)."""
    cdf = weights.cumsum(dim=-1)
    total = cdf[:, -1:]
    u = torch.rand(total.shape, generator=gen, device=weights.device, dtype=cdf.dtype) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, u, right=True).squeeze(1)
