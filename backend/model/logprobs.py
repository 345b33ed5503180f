"""Log-probabilities of sampled tokens, as OpenAI's `logprobs` reports them.

Invariant: they are the log_softmax of the very float32 logits the sampler chose from, before
temperature and top-p: the model's own distribution, whatever the sampling settings.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from backend.engine.plan import TokenLogprobs


def token_logprobs(
    logits: torch.Tensor, tokens: Sequence[int], tops: Sequence[int]
) -> list[TokenLogprobs]:
    """logits: [N, V] fp32 rows that asked; tokens: the N chosen ids; tops: per row, how many
    of the most likely tokens to list (0..V)."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # [N, V]
    chosen = logp.gather(1, torch.tensor(tokens, device=logp.device).unsqueeze(1))  # [N, 1]
    k = max(tops, default=0)
    if k > 0:
        values, ids = logp.topk(min(k, logp.shape[-1]), dim=-1)  # [N, k], most likely first
        top_values, top_ids = values.tolist(), ids.tolist()
    else:
        top_values = top_ids = [[] for _ in tokens]
    return [
        TokenLogprobs(
            logprob=lp,
            top=tuple(zip(top_ids[i][: tops[i]], top_values[i][: tops[i]], strict=True)),
        )
        for i, lp in enumerate(chosen.squeeze(1).tolist())
    ]
