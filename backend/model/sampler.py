"""Chooses the next token from logits: greedy at temperature 0, else temperature and top-p.

Invariant: with a seed, the token drawn depends only on (seed, num_generated) and the row's
logits, never on which other sequences share the batch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from backend.engine.plan import SamplingParams


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
    """logits: [N, V] fp32 -> N token ids. `generator` serves rows without a seed."""
    greedy = logits.argmax(dim=-1)  # [N]
    if all(p.temperature <= 0 for p in params):
        return [int(t) for t in greedy.tolist()]
    tokens = greedy.clone()
    for i, p in enumerate(params):
        if p.temperature <= 0:
            continue
        gen = generator
        if p.seed is not None:
            gen = seeded_generator(p.seed, num_generated[i], logits.device)
        tokens[i] = _draw(logits[i], p.temperature, p.top_p, gen)
    return [int(t) for t in tokens.tolist()]


def _draw(
    logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator
) -> torch.Tensor:
    """logits: [V] -> a 0-d token id tensor."""
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        drop = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        choice = torch.multinomial(sorted_probs, 1, generator=gen)
        return order[choice[0]]
    return torch.multinomial(probs, 1, generator=gen)[0]
