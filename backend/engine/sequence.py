"""One request's state inside the engine: tokens, progress, block table, provenance, when it stops.

Invariant: `block_namespaces` is read from the pool's block metadata whenever a block enters the
block table (allocation or prefix hit), and `block_runs` from it too; neither is copied from the
request, and `block_namespaces` only grows. Block i belongs to `namespace_at(i)`: a leading
public segment's namespace, else the request's own.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from backend.engine.plan import SamplingParams
from backend.engine.prefix_cache import BlockHash, chain_hashes
from kvfence.capability import Namespace

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True, slots=True)
class Segment:
    """Blocks [previous segment's end, `end`) of a sequence belong to public `namespace`."""

    namespace: Namespace
    end: int


def check_segments(own: Namespace, public: tuple[Segment, ...], prompt_blocks: int) -> None:
    """Public segments lead the prompt's full blocks, in order, in namespaces of their own
    (ValueError otherwise); a request-scoped namespace has none."""
    ends = [0, *(s.end for s in public)]
    if any(a >= b for a, b in itertools.pairwise(ends)) or ends[-1] > prompt_blocks:
        raise ValueError("public segments must be non-empty, in order, within the prompt")
    names = {s.namespace for s in public}
    if own in names or len(names) != len(public) or (public and own.ephemeral):
        raise ValueError("public segments need namespaces of their own")


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    """A prompt plus the tokens generated so far; positions below `num_computed` are in the pool."""

    seq_id: int
    namespace: Namespace
    token_ids: list[int]
    prompt_len: int
    sampling: SamplingParams
    stop_token_ids: frozenset[int]
    public: tuple[Segment, ...] = ()  # leading blocks in public namespaces
    block_hashes: list[BlockHash] = field(default_factory=list)  # one per full block of tokens
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0
    num_indexed_blocks: int = 0  # leading table blocks already offered to the prefix cache
    cached_tokens: int = 0  # prompt tokens served from the cache at first admission
    admitted: bool = False
    reported: bool = False  # the first output (with provenance) has been emitted
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    block_namespaces: set[Namespace] = field(default_factory=set)
    # Set at the first sampled token: each prompt block's namespace, as runs (namespace, blocks).
    block_runs: tuple[tuple[Namespace, int], ...] = ()
    _snapshot: tuple[int, ...] = ()

    def table_snapshot(self) -> tuple[int, ...]:
        """The block table as a tuple, rebuilt only when it grew (the table only ever appends
        between resets, so equal length means equal content)."""
        if len(self._snapshot) != len(self.block_table):
            self._snapshot = tuple(self.block_table)
        return self._snapshot

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def public_blocks(self) -> int:
        return self.public[-1].end if self.public else 0

    def namespace_at(self, index: int) -> Namespace:
        """The namespace block `index` of this sequence belongs to."""
        for segment in self.public:
            if index < segment.end:
                return segment.namespace
        return self.namespace

    def prompt_runs(
        self, owner: Callable[[int], Namespace], block_size: int
    ) -> tuple[tuple[Namespace, int], ...]:
        """Which namespace each block of the prompt came from, as runs of (namespace, blocks),
        read from block metadata through `owner` (block id -> the namespace that filled it)."""
        runs: list[tuple[Namespace, int]] = []
        for block_id in self.block_table[: -(-self.prompt_len // block_size)]:
            filled_by = owner(block_id)
            if runs and runs[-1][0] == filled_by:
                runs[-1] = (filled_by, runs[-1][1] + 1)
            else:
                runs.append((filled_by, 1))
        return tuple(runs)

    def stop_reason(self, token: int, room: int) -> FinishReason | None:
        """Why the sequence stops once `token` is appended (None: it goes on); `room`: the most
        tokens the blocks it may hold can store."""
        if token in self.stop_token_ids:
            return "stop"
        if self.num_generated >= self.sampling.max_tokens:
            return "length"
        if self.num_tokens > room:
            return "length"  # the next token could not be stored
        return None

    def hash_full_blocks(self, block_size: int) -> None:
        """Extend `block_hashes` to every full block of token_ids (only the new ones are hashed)."""
        chain_hashes(self.namespace_at, self.token_ids, block_size, self.block_hashes)

    def block_tokens(self, index: int, block_size: int) -> list[int]:
        return self.token_ids[index * block_size : (index + 1) * block_size]

    def reset_progress(self) -> None:
        """Forget the KV (after preemption): the whole sequence is recomputed or re-hit."""
        self.block_table = []
        self._snapshot = ()
        self.num_computed = 0
        self.num_indexed_blocks = 0
