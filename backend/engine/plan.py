"""What the scheduler hands the model runner for one step, and the runner's contract.

Invariant: a chunk's block table covers every position the chunk reads or writes; positions below
`start` are already in the KV pool, and `zero_blocks` are zeroed before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

# How a step's token budget is spent on prompts after the decodes (which always go first):
# "fill" splits the next prompt to use the whole budget; "whole" starts a prompt in a step only
# when it completes there, unless the step has no prompt yet (so a long prompt is still chunked
# and every step makes progress). For equal prompts "whole" finishes each prompt one step earlier
# than "fill" does, so first tokens arrive sooner; with short prompts both pack a step alike.
PrefillPolicy = Literal["fill", "whole"]
PREFILL_POLICIES: tuple[PrefillPolicy, ...] = ("fill", "whole")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None  # None: none; k >= 0: the chosen token's and the k most likely


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """Log-probabilities of one sampled token under the model's unmodified distribution
    (log_softmax of the float32 logits, before temperature and top-p)."""

    logprob: float  # the chosen token's
    top: tuple[tuple[int, float], ...]  # (token id, logprob), most likely first


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one step sampled: a token for every chunk with `sample`, and logprobs for those of
    them whose sampling asked for logprobs."""

    tokens: dict[int, int]  # seq id -> token id
    logprobs: dict[int, TokenLogprobs] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One sequence's share of one step: compute the KV of `token_ids` at positions
    [start, start + len(token_ids)), attending to positions [0, start + len(token_ids))."""

    seq_id: int
    token_ids: tuple[int, ...]
    start: int
    block_table: tuple[int, ...]
    sample: bool  # True when the chunk ends at the sequence's last token: sample the next one
    sampling: SamplingParams
    num_generated: int  # tokens generated so far; with a seed, sampling depends only on it
    prompt_len: int  # positions below it hold prompt tokens, the rest tokens the model generated


@dataclass(frozen=True, slots=True)
class StepPlan:
    chunks: tuple[Chunk, ...]
    zero_blocks: tuple[int, ...] = ()


class Runner(Protocol):
    """Executes step plans on a model. Only implementation that touches torch: backend.runner."""

    block_size: int
    num_blocks: int

    def execute(self, plan: StepPlan) -> StepResult:
        """Run one step; a sampled token for every chunk with `sample` (and its logprobs when
        the chunk's sampling asks for them)."""
        ...
