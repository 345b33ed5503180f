"""The engine loop: requests in, one scheduled step per call, tokens out with their provenance.

Invariant: the only way into the KV pool is `add` with a verified `Namespace` (and verified
public namespaces for its leading blocks); each sequence's first output reports the namespaces
recorded on the blocks it used, and which block came from which, read from block metadata.
Pure Python: no torch here; the model runs behind the `Runner` protocol.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from backend.engine.block_pool import BlockPool
from backend.engine.plan import PrefillPolicy, Runner, SamplingParams, TokenLogprobs
from backend.engine.scheduler import Scheduler
from backend.engine.sequence import (
    FinishReason,
    Segment,
    Sequence,
    SequenceStatus,
    check_segments,
)
from kvfence.capability import Namespace

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineStats",
    "FinishReason",
    "StepOutput",
]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    num_blocks: int = 1024
    block_size: int = 16
    max_num_seqs: int = 64
    max_step_tokens: int = 512
    max_share: float = 1.0  # the largest share of the pool any capacity group may hold
    prefill_policy: PrefillPolicy = "fill"  # see backend.engine.plan.PrefillPolicy
    zero_on_reuse: bool = True  # zero a block before another namespace writes it

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        if self.max_num_seqs < 1 or self.max_step_tokens < 1:
            raise ValueError("max_num_seqs and max_step_tokens must be positive")
        if not 0.0 < self.max_share <= 1.0:
            raise ValueError("max_share must be in (0, 1]")


@dataclass(frozen=True, slots=True)
class StepOutput:
    """One new token; `cached_tokens`, `block_namespaces` and `block_runs` are set on the first
    output only, `logprobs` on every output of a sequence whose sampling asked for them."""

    seq_id: int
    token_id: int
    finished: bool
    finish_reason: FinishReason | None = None
    cached_tokens: int | None = None
    block_namespaces: frozenset[Namespace] | None = None
    # The namespace of each block of the prompt, in order, as runs of (namespace, blocks).
    block_runs: tuple[tuple[Namespace, int], ...] | None = None
    logprobs: TokenLogprobs | None = None


@dataclass(frozen=True, slots=True)
class EngineStats:
    blocks_used: int
    blocks_free: int
    blocks_cached: int  # cached and unreferenced (reusable by a hit, evictable)
    prompt_tokens: int  # admitted prompt tokens, total
    hit_tokens: int  # of which served from the prefix cache
    waiting: int  # queue depth
    running: int
    namespace_blocks: Mapping[str, int]  # keyed by namespace label (`namespace_label`)
    group_blocks: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # (held, floor)


class Engine:
    """Drives a Runner with continuous batching over a namespace-scoped paged KV pool."""

    def __init__(self, runner: Runner, config: EngineConfig) -> None:
        if runner.block_size != config.block_size:
            raise ValueError("runner and engine disagree on the block size")
        if runner.num_blocks < config.num_blocks:
            raise ValueError("the runner's KV pool is smaller than the engine's block count")
        self.config = config
        self._runner = runner
        self._pool = BlockPool(
            config.num_blocks,
            config.block_size,
            max_share=config.max_share,
            zero_on_reuse=config.zero_on_reuse,
        )
        self._scheduler = Scheduler(
            self._pool,
            max_num_seqs=config.max_num_seqs,
            max_step_tokens=config.max_step_tokens,
            prefill_policy=config.prefill_policy,
        )
        self._ids = itertools.count(1)
        self._prompt_tokens = 0
        self._hit_tokens = 0

    @property
    def pool(self) -> BlockPool:
        return self._pool

    def add(
        self,
        namespace: Namespace,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        eos_token_ids: Iterable[int] = (),
        public: tuple[Segment, ...] = (),
    ) -> int:
        """Queue a request; OverCapacity if it can never fit, ValueError if empty.
        `public`: the leading blocks that belong to public namespaces (from verified grants)."""
        if not isinstance(namespace, Namespace) or not all(
            isinstance(s.namespace, Namespace) for s in public
        ):
            raise TypeError("the engine accepts only a verified Namespace")
        if not prompt_token_ids:
            raise ValueError("empty prompt")
        if sampling.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        check_segments(namespace, public, len(prompt_token_ids) // self.config.block_size)
        seq = Sequence(
            seq_id=next(self._ids),
            namespace=namespace,
            token_ids=list(prompt_token_ids),
            prompt_len=len(prompt_token_ids),
            sampling=sampling,
            stop_token_ids=frozenset(eos_token_ids) | frozenset(sampling.stop_token_ids),
            public=public,
        )
        self._scheduler.add(seq)
        return seq.seq_id

    def step(self) -> list[StepOutput]:
        """Schedule and run one step; returns the tokens it produced."""
        if not self.has_work():
            return []
        plan = self._scheduler.schedule()
        if not plan.chunks and not plan.zero_blocks:
            return []
        result = self._runner.execute(plan)
        return [
            self._output(seq, token, result.logprobs.get(seq.seq_id))
            for seq, token in self._scheduler.update(plan, result.tokens)
        ]

    def _output(self, seq: Sequence, token: int, logprobs: TokenLogprobs | None) -> StepOutput:
        finished = seq.status is SequenceStatus.FINISHED
        reason = seq.finish_reason if finished else None
        if seq.reported:
            return StepOutput(seq.seq_id, token, finished, reason, logprobs=logprobs)
        seq.reported = True
        self._prompt_tokens += seq.prompt_len
        self._hit_tokens += seq.cached_tokens
        return StepOutput(
            seq.seq_id,
            token,
            finished,
            reason,
            cached_tokens=seq.cached_tokens,
            block_namespaces=frozenset(seq.block_namespaces),
            block_runs=seq.block_runs,
            logprobs=logprobs,
        )

    def abort(self, seq_id: int) -> bool:
        """Stop a request (client gone) and free its blocks now; False if unknown/finished."""
        return self._scheduler.finish(seq_id, "abort")

    def finish(self, seq_id: int, reason: FinishReason) -> bool:
        """Mark a request finished from outside (e.g. a stop string matched); frees its blocks."""
        return self._scheduler.finish(seq_id, reason)

    def flush(self, namespace: Namespace) -> int:
        """Drop one namespace's cached blocks; returns how many left the cache."""
        if not isinstance(namespace, Namespace):
            raise TypeError("the engine accepts only a verified Namespace")
        return self._pool.flush(namespace)

    def has_work(self) -> bool:
        """Requests to run, or blocks a request-scoped namespace left that wait to be zeroed."""
        return self._scheduler.has_work() or self._pool.has_scrub

    def stats(self) -> EngineStats:
        pool = self._pool
        return EngineStats(
            blocks_used=pool.num_used,
            blocks_free=pool.num_free,
            blocks_cached=pool.num_cached_idle,
            prompt_tokens=self._prompt_tokens,
            hit_tokens=self._hit_tokens,
            waiting=self._scheduler.num_waiting,
            running=self._scheduler.num_running,
            namespace_blocks={ns.label: n for ns, n in pool.held().items()},
            group_blocks={g: (n, pool.groups.floor(g)) for g, n in pool.groups.held.items()},
        )
