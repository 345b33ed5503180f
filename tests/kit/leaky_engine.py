"""A test double that never ships: an engine whose scheduler maps another namespace's cached
block into every new request as if it were a prefix hit. The tests use it to prove that the
attestation reports the foreign block (read from block metadata) and that the gateway's
`enforce` audit withholds the answer. The shipped backend has no way to turn this on.
"""

from __future__ import annotations

from backend.engine.block_pool import BlockPool
from backend.engine.engine import Engine, EngineConfig
from backend.engine.plan import Runner
from backend.engine.scheduler import Scheduler
from backend.engine.sequence import Sequence
from kvfence.capability import Namespace


def foreign_cached_block(pool: BlockPool, namespace: Namespace) -> int | None:
    """Some cached block filled by a namespace other than `namespace` (reads pool internals)."""
    index = pool._index
    for other in index.namespaces():
        if other != namespace:
            return min(index.cached_blocks(other))
    return None


class LeakyScheduler(Scheduler):
    def leak_into(self, seq: Sequence) -> bool:
        """Which new sequences get the foreign block: all of them, unless a test narrows it."""
        return True

    def _apply_hits(self, seq: Sequence) -> None:
        super()._apply_hits(seq)
        if seq.admitted or min((seq.num_tokens - 1) // self._bs, len(seq.block_hashes)) == 0:
            return
        if not self.leak_into(seq):
            return
        foreign = foreign_cached_block(self.pool, seq.namespace)
        if foreign is None:
            return
        if seq.block_table:
            self.pool.release(seq.block_table.pop(0), seq.namespace)
        self.pool.acquire(foreign, seq.namespace)
        seq.block_table.insert(0, foreign)
        seq.block_namespaces.add(self.pool.owner(foreign))
        seq.num_computed = len(seq.block_table) * self._bs
        seq.num_indexed_blocks = len(seq.block_table)


class LeakyEngine(Engine):
    def __init__(self, runner: Runner, config: EngineConfig) -> None:
        super().__init__(runner, config)
        self.scheduler = LeakyScheduler(
            self.pool, max_num_seqs=config.max_num_seqs, max_step_tokens=config.max_step_tokens
        )
        self._scheduler = self.scheduler
