"""FakeRunner: a stand-in for the torch runner that keeps a fake KV pool of token ids.

It writes each chunk's tokens into the slots its block table names, reads the whole context back
through the block table, and returns a token that is a pure function of that context. So a
scheduler that maps the wrong block, skips a write or reads a zeroed slot changes the output (or
raises), and a correct one gives the same tokens with or without the prefix cache.
"""

from __future__ import annotations

import struct
import zlib

from backend.engine.plan import StepPlan, StepResult


class FakeKVError(AssertionError):
    """The plan read a slot that was never written (or was zeroed) or is otherwise malformed."""


class FakeRunner:
    def __init__(self, num_blocks: int, block_size: int, vocab: int = 50) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.vocab = vocab
        self.plans: list[StepPlan] = []
        self.zeroed: list[int] = []
        self._kv: list[list[int | None]] = [[None] * block_size for _ in range(num_blocks)]

    def execute(self, plan: StepPlan) -> StepResult:
        self.plans.append(plan)
        for block_id in plan.zero_blocks:
            self._kv[block_id] = [None] * self.block_size
            self.zeroed.append(block_id)
        out: dict[int, int] = {}
        for chunk in plan.chunks:
            end = chunk.start + len(chunk.token_ids)
            if len(chunk.block_table) * self.block_size < end:
                raise FakeKVError(f"seq {chunk.seq_id}: block table too short")
            for offset, token in enumerate(chunk.token_ids):
                self._write(chunk.block_table, chunk.start + offset, token)
        for chunk in plan.chunks:
            if chunk.sample:
                end = chunk.start + len(chunk.token_ids)
                context = [self._read(chunk.block_table, p, chunk.seq_id) for p in range(end)]
                out[chunk.seq_id] = self.next_token(context)
        return StepResult(out)

    def next_token(self, context: list[int]) -> int:
        """The deterministic 'model': a checksum of the context, modulo the vocabulary."""
        return zlib.crc32(struct.pack(f"<{len(context)}I", *context)) % self.vocab

    def _write(self, table: tuple[int, ...], position: int, token: int) -> None:
        self._kv[table[position // self.block_size]][position % self.block_size] = token

    def _read(self, table: tuple[int, ...], position: int, seq_id: int) -> int:
        value = self._kv[table[position // self.block_size]][position % self.block_size]
        if value is None:
            raise FakeKVError(f"seq {seq_id} read an unwritten slot at position {position}")
        return value

    def reference(self, prompt: list[int], max_tokens: int, stop: frozenset[int]) -> list[int]:
        """What a correct engine generates for prompt, computed without any KV pool."""
        context = list(prompt)
        out: list[int] = []
        while len(out) < max_tokens:
            token = self.next_token(context)
            out.append(token)
            context.append(token)
            if token in stop:
                break
        return out
