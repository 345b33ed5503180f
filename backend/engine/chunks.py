"""The prefill-chunk choice: how many of a sequence's uncomputed tokens one step runs under the
prefill policy, and the chunk that carries them to the runner.

Invariant: a chunk never runs more tokens than its budget, and it asks for a sample only when it
ends at the sequence's last token.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from backend.engine.plan import Chunk, PrefillPolicy
from backend.engine.sequence import Sequence


def tokens_to_run(seq: Sequence, budget: int, chunks: Seq[Chunk], policy: PrefillPolicy) -> int:
    """How many of seq's uncomputed tokens this step runs (0: none this step), given the
    chunks already in the step."""
    left = seq.num_tokens - seq.num_computed
    if budget <= 0:
        return 0
    if left <= budget or policy == "fill":
        return min(left, budget)
    # "whole": a prompt that does not fit is split only into a step with no prompt yet.
    return budget if all(len(c.token_ids) == 1 for c in chunks) else 0


def next_chunk(seq: Sequence, n: int) -> Chunk:
    """The next n tokens of seq, with its block table as it stands."""
    start = seq.num_computed
    return Chunk(
        seq_id=seq.seq_id,
        token_ids=tuple(seq.token_ids[start : start + n]),
        start=start,
        block_table=seq.table_snapshot(),
        sample=start + n == seq.num_tokens,
        sampling=seq.sampling,
        num_generated=seq.num_generated,
        prompt_len=seq.prompt_len,
    )
