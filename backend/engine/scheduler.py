"""Continuous batching: which sequences run each step, with how many tokens, in which blocks.

Invariant: every scheduled chunk's block table covers the positions it writes; block i of a
sequence is only ever a block of `namespace_at(i)` (its own namespace, or a public one for the
leading blocks its handle allows; prefix hits are looked up by that namespace); per-step work is
proportional to the running sequences, never to the pool size.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque

from backend.engine.block_pool import AllocationError, BlockPool, QuotaExceededError
from backend.engine.chunks import next_chunk, tokens_to_run
from backend.engine.plan import PREFILL_POLICIES, Chunk, PrefillPolicy, StepPlan
from backend.engine.sequence import FinishReason, Sequence, SequenceStatus
from kvfence.capability import Namespace


class OverCapacity(Exception):
    """A prompt that can never fit: more blocks than its namespace's share of the pool (or its
    public prefix more than its group's). The worker answers it as the request's error."""


class Scheduler:
    """Waiting queue (FIFO, preempted sequences first) and a running set ordered by arrival."""

    def __init__(
        self,
        pool: BlockPool,
        *,
        max_num_seqs: int,
        max_step_tokens: int,
        prefill_policy: PrefillPolicy = "fill",
    ) -> None:
        if prefill_policy not in PREFILL_POLICIES:
            raise ValueError(f"unknown prefill policy {prefill_policy!r}")
        self.pool = pool
        self.max_num_seqs = max_num_seqs
        self.max_step_tokens = max_step_tokens
        self.prefill_policy = prefill_policy
        self._bs = pool.block_size
        self._seqs: dict[int, Sequence] = {}
        self._waiting: deque[Sequence] = deque()
        self._running: list[int] = []  # seq ids, ascending = oldest first

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    def add(self, seq: Sequence) -> None:
        blocks = -(-seq.num_tokens // self._bs)
        start = 0
        for segment in seq.public:  # public blocks count against their own group's ceiling
            if segment.end - start > self.pool.ceiling(segment.namespace):
                raise OverCapacity("the prompt's public prefix exceeds its KV capacity")
            start = segment.end
        if blocks - seq.public_blocks > self.pool.ceiling(seq.namespace):
            raise OverCapacity(
                f"prompt of {seq.num_tokens} tokens exceeds the namespace's KV capacity"
            )
        seq.hash_full_blocks(self._bs)
        self._seqs[seq.seq_id] = seq
        self._waiting.append(seq)

    def schedule(self) -> StepPlan:
        budget = self.max_step_tokens
        chunks: list[Chunk] = []
        preempted = False
        # Decodes first: a prompt still being prefilled leaves a token for every decode.
        decodes = sum(
            self._seqs[i].num_tokens - self._seqs[i].num_computed == 1 for i in self._running
        )
        for seq_id in list(self._running):
            seq = self._seqs[seq_id]
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            decoding = seq.num_tokens - seq.num_computed == 1
            decodes -= decoding
            share = budget - (0 if decoding else decodes)
            n = tokens_to_run(seq, share, chunks, self.prefill_policy)
            if n == 0:
                continue
            if not self._reserve(seq, n):
                preempted = True
                continue
            chunks.append(next_chunk(seq, n))
            budget -= n
        if not preempted:
            self._admit(budget, chunks)
        # Zero requests wait for a plan that carries work; only blocks in a chunk are written.
        # Blocks a request-scoped namespace left are zeroed at once, with or without work.
        zero = self.pool.take_zero_blocks() if chunks else ()
        return StepPlan(tuple(chunks), zero + self.pool.take_scrub_blocks())

    def _grow(self, seq: Sequence, n: int) -> None:
        """Allocate the blocks seq needs to hold n more tokens, each in the namespace it belongs
        to (raises AllocationError; the blocks already allocated stay in the table)."""
        end = -(-(seq.num_computed + n) // self._bs)
        while len(seq.block_table) < end:
            start = len(seq.block_table)
            namespace = seq.namespace_at(start)
            stop = start + 1
            while stop < end and seq.namespace_at(stop) == namespace:
                stop += 1
            seq.block_table.extend(self.pool.allocate(namespace, stop - start))
            seq.block_namespaces.add(namespace)

    def _reserve(self, seq: Sequence, n: int) -> bool:
        """Make room for a running sequence, preempting the newest ones; False if seq itself was."""
        while True:
            try:
                self._grow(seq, n)
                return True
            except QuotaExceededError as err:
                victim = self._newest_running(err.group, seq)
            except AllocationError:
                victim = self._newest_running(None, seq)
            self._preempt(victim)
            if victim is seq:
                return False

    def _newest_running(self, group: str | None, fallback: Sequence) -> Sequence:
        """The newest running sequence holding blocks of `group` (any, for None); `fallback`
        (the one asking) when none does."""
        for seq_id in reversed(self._running):
            seq = self._seqs[seq_id]
            groups = {seq.namespace.group, *(s.namespace.group for s in seq.public)}
            if group is None or group in groups:
                return seq
        return fallback

    def _admit(self, budget: int, chunks: list[Chunk]) -> None:
        """Admit waiting sequences in order; one whose group is at its ceiling is skipped, not
        waited on, so a tenant at its ceiling cannot stall the others."""
        if budget == 0 or len(self._running) >= self.max_num_seqs:
            return
        candidates = list(itertools.islice(self._waiting, self.max_num_seqs))
        for seq in candidates:
            if budget == 0 or len(self._running) >= self.max_num_seqs:
                return
            if not seq.block_table:
                self._apply_hits(seq)
            n = tokens_to_run(seq, budget, chunks, self.prefill_policy)
            if n == 0:
                self._release_all(seq)
                return  # waiting prompts keep their order
            try:
                self._grow(seq, n)
            except AllocationError as err:
                self._release_all(seq)
                if isinstance(err, QuotaExceededError):
                    continue
                return
            self._waiting.remove(seq)
            if not seq.admitted:
                seq.admitted = True
                seq.cached_tokens = seq.num_computed
            seq.status = SequenceStatus.RUNNING
            bisect.insort(self._running, seq.seq_id)
            chunks.append(next_chunk(seq, n))
            budget -= n

    def _apply_hits(self, seq: Sequence) -> None:
        """Map the longest cached prefix of full blocks; the last token is always recomputed."""
        limit = min((seq.num_tokens - 1) // self._bs, len(seq.block_hashes))
        if seq.namespace.ephemeral:
            limit = 0  # a request-scoped namespace reuses nothing
        for i in range(limit):
            namespace = seq.namespace_at(i)
            block_id = self.pool.lookup(
                namespace, seq.block_hashes[i], seq.block_tokens(i, self._bs)
            )
            if block_id is None:
                break
            self._map_cached(seq, block_id, namespace)
        seq.num_computed = len(seq.block_table) * self._bs
        seq.num_indexed_blocks = len(seq.block_table)

    def _map_cached(self, seq: Sequence, block_id: int, namespace: Namespace) -> None:
        self.pool.acquire(block_id, namespace)
        seq.block_table.append(block_id)
        seq.block_namespaces.add(self.pool.owner(block_id))

    def update(self, plan: StepPlan, sampled: dict[int, int]) -> list[tuple[Sequence, int]]:
        """Apply a step's results: advance, index newly full blocks, append and stop-check."""
        events: list[tuple[Sequence, int]] = []
        for chunk in plan.chunks:
            seq = self._seqs.get(chunk.seq_id)
            if seq is None or seq.status is not SequenceStatus.RUNNING:
                continue
            seq.num_computed += len(chunk.token_ids)
            self._index_full_blocks(seq)
            if not chunk.sample:
                continue
            token = sampled[chunk.seq_id]
            if not seq.block_runs:
                seq.block_runs = seq.prompt_runs(self.pool.owner, self._bs)
            seq.token_ids.append(token)
            seq.hash_full_blocks(self._bs)
            room = (self.pool.ceiling(seq.namespace) + seq.public_blocks) * self._bs
            reason = seq.stop_reason(token, room)
            if reason is not None:
                self.finish(seq.seq_id, reason)
            events.append((seq, token))
        return events

    def _index_full_blocks(self, seq: Sequence) -> None:
        if seq.namespace.ephemeral:
            return  # never cached: its blocks go back free, and zeroed, when it ends
        full = seq.num_computed // self._bs
        for i in range(seq.num_indexed_blocks, full):
            tokens = seq.block_tokens(i, self._bs)
            self.pool.cache(seq.block_table[i], seq.block_hashes[i], tokens)
        seq.num_indexed_blocks = max(full, seq.num_indexed_blocks)

    def _preempt(self, seq: Sequence) -> None:
        self._running.remove(seq.seq_id)
        self._release_all(seq)
        seq.status = SequenceStatus.WAITING
        self._waiting.appendleft(seq)

    def _release_all(self, seq: Sequence) -> None:
        # Tail blocks first, so they sit at the cold end of the LRU and are evicted first.
        for i in reversed(range(len(seq.block_table))):
            self.pool.release(seq.block_table[i], seq.namespace_at(i))
        seq.reset_progress()

    def finish(self, seq_id: int, reason: FinishReason) -> bool:
        """Stop a sequence and free its blocks at once; False if it is unknown or finished."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            return False
        if seq.status is SequenceStatus.RUNNING:
            self._running.remove(seq_id)
        elif seq.status is SequenceStatus.WAITING:
            self._waiting.remove(seq)
        self._release_all(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        return True
