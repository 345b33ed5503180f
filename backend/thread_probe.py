"""Whether the engine may change its thread count between steps (`backend.threads`): the
model's kernels must give the same bits at every count it could choose, or the same prompt
would get another answer on a busy host than on a quiet one, and a cached block another value
than the one the same prompt computes afresh. Probed once, at start-up, on the loaded model.

Invariant: `agree` says True only when, at every count, (1) each kind of projection gives the
same bits for every row count its plan admits (generated and prompt calls), and (2) the same
paged steps (two prompts of different lengths, then decodes at batch 2 and 1) write the same
K/V into the pool and pick the same tokens; it leaves the thread count and the pool as it found
them (the blocks it used hold zeros again).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from backend.engine.plan import Chunk, SamplingParams, StepPlan
from backend.runner import ModelRunner

_GREEDY = SamplingParams(max_tokens=1 << 20, temperature=0.0)
_PROMPTS = (37, 70)  # tokens: a tile boundary crossed, a block boundary crossed, padded tails
_DECODES = 4


def thread_counts(most: int) -> tuple[int, ...]:
    """The counts a governor starting at `most` can choose: most, most // 2, ..., 1."""
    out = [most]
    while out[-1] > 1:
        out.append(out[-1] // 2)
    return tuple(out)


def agree(runner: ModelRunner, counts: Sequence[int]) -> bool:
    """Whether every count in `counts` gives the bits the first gives (see the invariant)."""
    before = torch.get_num_threads()
    try:
        with torch.inference_mode():
            first = _observe(runner, counts[0])
            return all(_same(first, _observe(runner, n)) for n in counts[1:])
    finally:
        torch.set_num_threads(before)


def _observe(runner: ModelRunner, threads: int) -> list[Any]:
    torch.set_num_threads(threads)
    return [*_projections(runner), *_steps(runner)]


def _projections(runner: ModelRunner) -> list[torch.Tensor]:
    out = []
    for proj in runner.model.projections().values():
        weight = proj.weight
        gen = torch.Generator().manual_seed(0)
        sizes = [*range(1, proj.plan.generated_rows + 1), *proj.plan.prompt_sizes]
        x = torch.randn(max(sizes), weight.shape[1], generator=gen)
        x = x.to(device=weight.device, dtype=weight.dtype)
        out += [proj(x[:m], m) for m in range(1, proj.plan.generated_rows + 1)]
        out += [proj(x[:m], 0) for m in proj.plan.prompt_sizes]
    return out


def _steps(runner: ModelRunner) -> list[Any]:
    """Tokens and the K/V written by a short paged run in the pool's first blocks."""
    bs = runner.block_size
    per = -(-(max(_PROMPTS) + _DECODES + 1) // bs)
    if per * len(_PROMPTS) > runner.num_blocks:
        return []  # a pool too small to probe in: the projections decide alone
    vocab = runner.loaded.config.vocab
    prompts = [tuple((7 * i + 3 * n) % vocab for i in range(n)) for n in _PROMPTS]
    tables = [tuple(range(i * per, (i + 1) * per)) for i in range(len(prompts))]
    used = [b for t in tables for b in t]
    runner.zero_blocks(used)
    chunks = [Chunk(i, p, 0, tables[i], True, _GREEDY, 0, len(p)) for i, p in enumerate(prompts)]
    last = runner.execute(StepPlan(tuple(chunks))).tokens
    seen: list[Any] = [dict(last)]
    for step in range(_DECODES):
        live = range(len(prompts)) if step < _DECODES - 1 else range(1)  # batch 2, then 1
        chunks = [_decode(i, prompts[i], last[i], step, tables[i]) for i in live]
        last = {**last, **runner.execute(StepPlan(tuple(chunks))).tokens}
        seen.append(dict(last))
    ids = torch.tensor(used, device=runner.device)
    seen += [runner.pool.k[:, ids].clone(), runner.pool.v[:, ids].clone()]
    runner.zero_blocks(used)
    return seen


def _decode(seq: int, prompt: tuple[int, ...], token: int, step: int, table: Any) -> Chunk:
    """The decode of `seq`'s token at `step` (its first after the prompt at step 0)."""
    return Chunk(seq, (token,), len(prompt) + step, table, True, _GREEDY, step + 1, len(prompt))


def _same(a: list[Any], b: list[Any]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and torch.equal(x, y)):
                return False
        elif x != y:
            return False
    return True
