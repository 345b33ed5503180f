"""One request's state inside the engine: tokens, progress, block table and provenance.

Invariant: `block_namespaces` is read from the pool's block metadata whenever a block enters the
block table (allocation or prefix hit); it is never copied from the request and only grows.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal

from backend.engine.plan import SamplingParams
from backend.engine.prefix_cache import BlockHash, chain_hashes
from kvfence.capability import Namespace

FinishReason = Literal["stop", "length", "abort"]


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

    def hash_full_blocks(self, block_size: int) -> None:
        """Extend `block_hashes` to every full block of token_ids (only the new ones are hashed)."""
        chain_hashes(self.namespace, self.token_ids, block_size, self.block_hashes)

    def block_tokens(self, index: int, block_size: int) -> list[int]:
        return self.token_ids[index * block_size : (index + 1) * block_size]

    def reset_progress(self) -> None:
        """Forget the KV (after preemption): the whole sequence is recomputed or re-hit."""
        self.block_table = []
        self._snapshot = ()
        self.num_computed = 0
        self.num_indexed_blocks = 0
